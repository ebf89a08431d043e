"""Backend name -> executor class: a static table. Each class states its own ``name``, ``settings_model`` and
per-batch limits, so this module only lists them; no executor imports the registry (no import circle)."""

from typing import Any

from pydantic import ValidationError

from batch_pipeline.core.errors import ConfigError
from batch_pipeline.core.run.executor import BatchExecutor, StreamExecutor
from batch_pipeline.core.spec.job import BackendSpec
from batch_pipeline.executors.anthropic.batch import AnthropicBatchExecutor
from batch_pipeline.executors.google.gemini_batch import GeminiBatchExecutor
from batch_pipeline.executors.google.vertex_batch import VertexBatchExecutor
from batch_pipeline.executors.bedrock.batch import BedrockBatchExecutor
from batch_pipeline.executors.online.executor import OnlineExecutor
from batch_pipeline.executors.openai.azure import AzureOpenAIBatchExecutor
from batch_pipeline.executors.openai.batch import OpenAIBatchExecutor
from batch_pipeline.executors.vllm.offline import VllmOfflineExecutor

Executor = BatchExecutor | StreamExecutor

EXECUTOR_CLASSES: tuple[type[Any], ...] = (
    OpenAIBatchExecutor,
    AzureOpenAIBatchExecutor,
    AnthropicBatchExecutor,
    GeminiBatchExecutor,
    VertexBatchExecutor,
    BedrockBatchExecutor,
    OnlineExecutor,
    VllmOfflineExecutor,
)
EXECUTORS: dict[str, type[Any]] = {cls.name: cls for cls in EXECUTOR_CLASSES}
if len(EXECUTORS) != len(EXECUTOR_CLASSES):
    raise RuntimeError("two executor classes state the same name")


def names() -> list[str]:
    return sorted(EXECUTORS)


def executor_class(name: str) -> type[Any]:
    try:
        return EXECUTORS[name]
    except KeyError:
        raise ConfigError(f"backend.name {name!r} is not a known executor; known: {names()}") from None


def batch_limits(name: str) -> tuple[int | None, int | None]:
    """(max requests, max bytes) per batch for a backend, without building it (no key needed)."""
    cls = executor_class(name)
    return getattr(cls, "max_requests_per_batch", None), getattr(cls, "max_bytes_per_batch", None)


def batch_minimum(backend: BackendSpec) -> int:
    """Requests a batch of this backend needs at least (0: no minimum), from its settings, without building it;
    the driver sends smaller shards to the tail backend (``JobFacts.min_batch``)."""
    cls = executor_class(backend.name)
    minimum = getattr(cls, "min_requests", None)
    return 0 if minimum is None else int(minimum(_settings(cls, backend)))


def _settings(cls: type[Any], backend: BackendSpec) -> Any:
    try:
        return cls.settings_model.model_validate(backend.settings)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"backend.settings for {backend.name}: {problems} (see {cls.settings_model.__name__} in "
                          f"{cls.__module__})") from None


def create_executor(backend: BackendSpec) -> Executor:
    """The executor for ``backend``, built from its validated settings (invalid ones are a ConfigError)."""
    cls = executor_class(backend.name)
    return cls(_settings(cls, backend))
