"""Backend name -> executor factory. Adding a backend is one ``@register`` away; no if-chains."""

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ValidationError

from batch_pipeline.core.errors import ConfigError
from batch_pipeline.core.run.executor import BatchExecutor, StreamExecutor
from batch_pipeline.core.spec.job import BackendSpec

Executor = BatchExecutor | StreamExecutor
Factory = Callable[[dict[str, Any]], Executor]
_FACTORIES: dict[str, Factory] = {}
_LIMITS: dict[str, tuple[int | None, int | None]] = {}


def register(name: str, settings: type[BaseModel], *, max_requests: int | None = None,
             max_bytes: int | None = None) -> Callable[[Callable[[Any], Executor]], Callable[[Any], Executor]]:
    """Register an executor built from its validated ``settings`` model (invalid ``backend.settings`` are a
    ``ConfigError`` naming the backend), with the backend's per-batch limits (the sharder respects them)."""

    def deco(build: Callable[[Any], Executor]) -> Callable[[Any], Executor]:
        if name in _FACTORIES:
            raise ValueError(f"executor {name!r} registered twice")

        def factory(raw: dict[str, Any]) -> Executor:
            try:
                parsed = settings.model_validate(raw)
            except ValidationError as exc:
                raise ConfigError(f"backend.settings for {name}: {exc}") from None
            return build(parsed)

        _FACTORIES[name] = factory
        _LIMITS[name] = (max_requests, max_bytes)
        return build

    return deco


def batch_limits(name: str) -> tuple[int | None, int | None]:
    """(max requests, max bytes) per batch for a backend, without building it (no key needed)."""
    _load_builtin()
    if name not in _FACTORIES:
        raise ConfigError(f"backend.name {name!r} is not a known executor; known: {names()}")
    return _LIMITS[name]


def _load_builtin() -> None:
    # importing the adapters registers them
    from batch_pipeline.executors import openai_batch  # noqa: F401
    from batch_pipeline.executors import anthropic_batch  # noqa: F401
    from batch_pipeline.executors import online  # noqa: F401
    from batch_pipeline.executors import vllm_offline  # noqa: F401


def names() -> list[str]:
    _load_builtin()
    return sorted(_FACTORIES)


def create_executor(backend: BackendSpec) -> Executor:
    _load_builtin()
    try:
        factory = _FACTORIES[backend.name]
    except KeyError:
        raise ConfigError(f"backend.name {backend.name!r} is not a known executor; known: {names()}") from None
    return factory(backend.settings)
