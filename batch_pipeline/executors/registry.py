"""Backend name -> executor class: a static table, imported on first use. Each class states its own ``name``,
``settings_model`` and per-batch limits, so this module only lists them; no executor imports the registry (no
import circle)."""

from datetime import timedelta
from functools import cache
from importlib import import_module
from typing import Any

from pydantic import ValidationError

from batch_pipeline.core.errors import ConfigError
from batch_pipeline.core.ledger.capacity import CapacityLedger, CapacityScope
from batch_pipeline.core.ledger.ceilings import Ceilings
from batch_pipeline.core.ledger.executor import BatchExecutor, StreamExecutor
from batch_pipeline.core.ledger.fallback import fallback_backend
from batch_pipeline.core.ledger.queue_clock import QueueClock
from batch_pipeline.core.route.plan import BackendProfile, Queues
from batch_pipeline.core.spec.job import AUTO_BACKEND, BackendSpec, JobSpec
from batch_pipeline.core.spec.quota import QuotaSpec
from batch_pipeline.core.store import Store
from batch_pipeline.executors.accounts import AccountSpread
from batch_pipeline.executors.quota import QueueCapped, account_label

Executor = BatchExecutor | StreamExecutor

# backend name -> "module:Class", imported when a job names it: each provider SDK costs 0.3-2.3 s to import
# (anthropic's types alone ~2 s), and a process that runs one backend pays for that one only
EXECUTORS: dict[str, str] = {
    "openai_batch": "batch_pipeline.executors.openai.batch:OpenAIBatchExecutor",
    "azure_openai_batch": "batch_pipeline.executors.openai.azure:AzureOpenAIBatchExecutor",
    "anthropic_batch": "batch_pipeline.executors.anthropic.batch:AnthropicBatchExecutor",
    "gemini_batch": "batch_pipeline.executors.google.gemini_batch:GeminiBatchExecutor",
    "vertex_batch": "batch_pipeline.executors.google.vertex_batch:VertexBatchExecutor",
    "bedrock_batch": "batch_pipeline.executors.bedrock.batch:BedrockBatchExecutor",
    "online": "batch_pipeline.executors.online.executor:OnlineExecutor",
    "vllm": "batch_pipeline.executors.vllm.offline:VllmOfflineExecutor",
}

# provider batch backend -> "module:SettingsClass", each in a module that does not import its SDK: a code location
# names each job's Dagster pool (``account_pool``) when it loads, and importing the SDK there cost every process
# that loads it 0.5-1 s. These are the queue-capped backends (``test_registry`` checks both tables agree).
PROVIDER_SETTINGS: dict[str, str] = {
    "openai_batch": "batch_pipeline.executors.openai.settings:OpenAIBatchSettings",
    "azure_openai_batch": "batch_pipeline.executors.openai.settings:AzureOpenAIBatchSettings",
    "anthropic_batch": "batch_pipeline.executors.anthropic.settings:AnthropicBatchSettings",
    "gemini_batch": "batch_pipeline.executors.google.settings:GeminiBatchSettings",
    "vertex_batch": "batch_pipeline.executors.google.settings:VertexBatchSettings",
    "bedrock_batch": "batch_pipeline.executors.bedrock.settings:BedrockBatchSettings",
}


def names() -> list[str]:
    return sorted(EXECUTORS)


def _named(where: str) -> Any:
    """The object a table entry ``"module:attr"`` names, its module imported on first use."""
    module, attr = where.split(":")
    return getattr(import_module(module), attr)


@cache
def executor_class(name: str) -> type[Any]:
    if name not in EXECUTORS:
        raise ConfigError(f"backend.name {name!r} is not a known executor; known: {names()}")
    cls = _named(EXECUTORS[name])
    if cls.name != name:
        raise RuntimeError(f"{EXECUTORS[name]} states the name {cls.name!r}, listed as {name!r}")
    return cls


def batch_limits(name: str) -> tuple[int | None, int | None]:
    """(max requests, max bytes) per batch for a backend, without building it (no key needed)."""
    if name == AUTO_BACKEND:  # routed per shard: the router applies each candidate's limits (route_profile)
        return None, None
    cls = executor_class(name)
    return getattr(cls, "max_requests_per_batch", None), getattr(cls, "max_bytes_per_batch", None)


def batch_minimum(backend: BackendSpec) -> int:
    """Requests a batch of this backend needs at least (0: no minimum), from its settings, without building it;
    the driver sends smaller shards to the tail backend (``JobFacts.min_batch``)."""
    if backend.name == AUTO_BACKEND:  # routed per shard: a shard below a candidate's minimum is routed elsewhere
        return 0
    cls = executor_class(backend.name)
    minimum = getattr(cls, "min_requests", None)
    return 0 if minimum is None else int(minimum(_settings(cls, backend)))


def batch_minimums(spec: JobSpec) -> dict[str, int]:
    """The job's backend's and its fallback's backend's minimum requests per batch, as ``load_view`` takes them."""
    fallback = fallback_backend(spec)
    return {
        "min_batch": batch_minimum(spec.backend),
        "fallback_min_batch": batch_minimum(fallback) if fallback is not None else 0,
    }


def capacity_of(backend: BackendSpec, model: str) -> list[tuple[CapacityScope, QuotaSpec]]:
    """The capacity scope (provider, account, model) and configured quota of each account of a provider batch
    backend, from its class and settings, unbuilt (no key needed); [] for a backend without a provider queue."""
    if backend.name == AUTO_BACKEND:
        return []
    cls = executor_class(backend.name)
    if not issubclass(cls, QueueCapped):
        return []
    settings = _settings(cls, backend)
    if settings.accounts:
        return [
            (CapacityScope(cls.name, a.label, model if cls.quota_per_model else "*"), a.quota)
            for a in settings.accounts
        ]
    return [(cls.scope_for(settings, model), settings.quota)]


def capacity_ledgers(store: Store, backend: BackendSpec, model: str) -> list[CapacityLedger]:
    """The capacity ledgers of the backend's account queues on this home ([]: the backend has no queue)."""
    return [
        CapacityLedger(store, scope, quota, hold_ttl=store.lease_ttl) for scope, quota in capacity_of(backend, model)
    ]


def account_pool(backend: BackendSpec) -> str | None:
    """The Dagster concurrency pool of a provider batch backend's shard steps: one per provider account
    (``<provider>/<account>``), so one job cannot take every run slot of an account that another job also uses.
    Its limit is the instance's ``concurrency.pools.default_limit`` (dagster.yaml, the Helm values) or
    ``dagster instance concurrency set <pool> N``."""
    if backend.name not in PROVIDER_SETTINGS:
        if backend.name != AUTO_BACKEND:
            executor_class(backend.name)  # an unknown name is a ConfigError
        return None
    settings = _parse_settings(_named(PROVIDER_SETTINGS[backend.name]), backend)
    labels = [a.label for a in settings.accounts] or [account_label(settings)]
    return f"{backend.name}/{'+'.join(labels)}"


def batch_ceilings(backend: BackendSpec) -> Ceilings | None:
    """The completion window and results retention of a provider batch backend (None: not a provider batch)."""
    if backend.name == AUTO_BACKEND:
        return None
    cls = executor_class(backend.name)
    return cls.ceilings(_settings(cls, backend)) if issubclass(cls, QueueCapped) else None


def route_queues(store: Store) -> Queues:
    """The router's view of a candidate's account queues on this home (``core/ledger/queue_clock.py``): their
    ledgers as they stand, and the window by which a batch in them ends at the latest."""

    def queues(backend: BackendSpec, model: str) -> QueueClock | None:
        ledgers = capacity_ledgers(store, backend, model)
        if not ledgers:
            return None
        ceilings = batch_ceilings(backend)
        window = (
            ceilings.window
            if ceilings is not None and ceilings.window is not None
            else timedelta(hours=route_profile(backend).turnaround_h or 24)
        )
        return QueueClock([ledger.snapshot(sweep=False) for ledger in ledgers], window)

    return queues


def route_profile(backend: BackendSpec) -> BackendProfile:
    """What the router's rules (core/route/rules.py) need of a backend, from its class and settings, unbuilt: a
    provider batch (submit/collect) or not, self-hosted or not, its per-batch minimum and maximum, its window."""
    cls = executor_class(backend.name)
    batch = hasattr(cls, "submit")
    settings = _settings(cls, backend)
    window = str(getattr(settings, "completion_window", "24h") or "24h")
    hours = float(window[:-1]) if window.endswith("h") and window[:-1].replace(".", "").isdigit() else 24.0
    return BackendProfile(
        self_hosted=getattr(cls, "pricing", None) == "self_hosted",
        batch=batch,
        min_requests=batch_minimum(backend) if batch else 0,
        max_requests=getattr(cls, "max_requests_per_batch", None) if batch else None,
        turnaround_h=hours if batch else 0.0,
    )


def _settings(cls: type[Any], backend: BackendSpec) -> Any:
    return _parse_settings(cls.settings_model, backend)


def _parse_settings(model: type[Any], backend: BackendSpec) -> Any:
    try:
        return model.model_validate(backend.settings)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in exc.errors())
        raise ConfigError(
            f"backend.settings for {backend.name}: {problems} (see {model.__name__} in {model.__module__})"
        ) from None


def create_executor(backend: BackendSpec) -> Executor:
    """The executor for ``backend``, built from its validated settings (invalid ones are a ConfigError)."""
    cls = executor_class(backend.name)
    settings = _settings(cls, backend)
    if getattr(settings, "accounts", None):  # several accounts: each its own executor, queue and re-attach
        return AccountSpread(cls, settings)
    return cls(settings)
