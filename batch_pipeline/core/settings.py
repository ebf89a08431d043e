"""Every ``BATCH_PIPELINE_*`` environment setting, read in one place, with one default for each.

The environment is read only at the edges of a process: the CLI command (``cli.main``), the code location's load
(``defs/project.py``) and a Component's load (``BatchInferenceJob.build_defs``). Each builds one ``Settings`` with
``Settings.from_env()`` and hands it down; nothing below reads ``os.environ`` for these (a test asserts it). A run's
steps get the storage root and the lease ttl through the store resource the edge built.
"""

import os
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from batch_pipeline.core.errors import ConfigError

PROJECT_ROOT = Path(__file__).resolve().parents[2]  # the checkout: data/jobs, data/prices.yaml, dagster.yaml
PREFIX = "BATCH_PIPELINE_"
DEFAULT_LEASE_TTL = timedelta(minutes=15)
DEFAULT_ENV_SECRETS = ("batch-pipeline-provider-keys", "batch-pipeline-storage")


def lease_ttl_of(seconds: float | None) -> timedelta:
    """A lease ttl of ``seconds`` (``BATCH_PIPELINE_LEASE_TTL_S``); unset or 0: ``DEFAULT_LEASE_TTL``."""
    return timedelta(seconds=seconds) if seconds else DEFAULT_LEASE_TTL


def _csv(value: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    parts = value.split(",") if isinstance(value, str) else value
    return tuple(p.strip() for p in parts if p.strip())


COLLECT_SHARDS_AT_ONCE = 3  # Settings.collect_shards_at_once


class K8sSettings(BaseModel):
    """The Kubernetes step executor and GPU step pods (``defs/k8s.py``); set by ``k8s/helm/values.yaml``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    executor: Literal["k8s", "in_process"] | None = Field(
        default=None, description="k8s: one pod per step; in_process: the whole run in its worker; unset: Dagster's"
    )
    namespace: str = "batch-pipeline"
    env_secrets: tuple[str, ...] = Field(default=DEFAULT_ENV_SECRETS, description="Secrets in every step pod")
    env_vars: tuple[str, ...] = Field(default=(), description="more variables copied from the run pod")
    step_cpu: str = "500m"
    step_memory: str = "1Gi"
    step_memory_limit: str = "4Gi"
    step_grace_s: int = Field(default=120, ge=0, description="time for a step to flush and release its lease")
    gpu_image: str | None = Field(default=None, description="image of GPU steps (unset: the code location's)")
    gpu_node_selector: str | None = Field(default=None, description="JSON object or k=v,k2=v2 (unset: GPU nodes)")
    gpu_toleration_key: str = "nvidia.com/gpu"
    gpu_cpu: str = "8"
    gpu_memory: str = "32Gi"
    gpu_shm: str = "8Gi"

    @field_validator("executor", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @field_validator("env_secrets", "env_vars", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        return _csv(value) if isinstance(value, (str, tuple, list)) else value


# the variable each k8s setting comes from (after the prefix)
K8S_ENV = {
    "executor": "EXECUTOR",
    "namespace": "K8S_NAMESPACE",
    "env_secrets": "K8S_ENV_SECRETS",
    "env_vars": "K8S_ENV_VARS",
    **{f: f.upper() for f in K8sSettings.model_fields if f.startswith(("step_", "gpu_"))},
}


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)  # strings from the environment are coerced

    home: str = Field(
        default_factory=lambda: str(Path.cwd() / ".batch_pipeline"),
        description="storage root: a local folder or s3://bucket/prefix (default ./.batch_pipeline)",
    )
    jobs: Path = Field(default=PROJECT_ROOT / "data" / "jobs", description="folder of job specs")
    prices: Path = Field(default=PROJECT_ROOT / "data" / "prices.yaml", description="price table")
    sensor_interval_s: int = Field(default=30, gt=0)
    shards_per_run: int = Field(
        default=50,
        gt=0,
        description="at most this many shards move in one Dagster run (a partition range of at most this length)",
    )
    collect_shards_at_once: int = Field(
        default=COLLECT_SHARDS_AT_ONCE,
        ge=1,
        description="shards of one run whose ended batches are collected at the same time (downloads, parses and "
        "writes overlap; 1: one after another). Each shard's collection is a chain (parse, then build, then write), "
        "so on 2 cores 3 keep both busy: 5-10% more lines/s than 2 (benchmarks/README.md)",
    )
    lease_ttl_s: float | None = Field(default=None, gt=0, description="shard lease ttl (default 15 minutes)")
    arrow_memory_pool: Literal["jemalloc", "mimalloc", "system"] = Field(
        default="jemalloc",
        description="Arrow's allocator in this process (``core/arrow_pool.py``): jemalloc took 4-7% less CPU than "
        "pyarrow's default mimalloc on the manifest and results ingestion (benchmarks/README.md)",
    )
    k8s: K8sSettings = Field(default_factory=K8sSettings)

    @property
    def lease_ttl(self) -> timedelta:
        """How long a lease or a capacity hold written under this home stays valid without a renewal."""
        return lease_ttl_of(self.lease_ttl_s)

    def with_home(self, home: str) -> "Settings":
        """These settings on another storage root (``--home``): a local path is made absolute."""
        return self.model_copy(update={"home": home if "://" in home else str(Path(home).resolve())})

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        """The settings of this process's environment; a bad value is a ConfigError naming its variable."""
        env = os.environ if env is None else env

        def given(names: Mapping[str, str]) -> dict[str, str]:
            out = {}
            for field, name in names.items():
                value = env.get(PREFIX + name, "").strip()
                if value:
                    out[field] = value
            return out

        top = {f: f.upper() for f in cls.model_fields if f != "k8s"}
        try:
            return cls.model_validate({**given(top), "k8s": given(K8S_ENV)})
        except ValidationError as exc:
            problems = "; ".join(_problem(e, top) for e in exc.errors())
            raise ConfigError(f"invalid environment setting: {problems}") from None


def _problem(error: Mapping, top: Mapping[str, str]) -> str:
    loc = [str(part) for part in error["loc"]]
    name = K8S_ENV.get(loc[1], loc[1].upper()) if loc[0] == "k8s" and len(loc) > 1 else top.get(loc[0], loc[0])
    return f"${PREFIX}{name}={error.get('input')!r}: {error['msg']}"
