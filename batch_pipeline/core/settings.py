"""Every ``BATCH_PIPELINE_*`` environment setting, read in one place, with one default for each.

``Settings.from_env()`` reads the environment when called (the CLI sets ``BATCH_PIPELINE_HOME`` from ``--home``
before it builds anything), so callers ask for it where they need it instead of reading ``os.environ``.
"""

import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from batch_pipeline.core.errors import ConfigError

PROJECT_ROOT = Path(__file__).resolve().parents[2]  # the checkout: data/jobs, data/prices.yaml, dagster.yaml
PREFIX = "BATCH_PIPELINE_"


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)  # strings from the environment are coerced

    home: str = Field(description="storage root: a local folder or s3://bucket/prefix (default ./.batch_pipeline)")
    jobs: Path = Field(description="folder of job specs (default data/jobs of the checkout)")
    prices: Path = Field(description="price table (default data/prices.yaml of the checkout)")
    sandbox_url: str | None = Field(default=None, description="a running provider sandbox, e.g. http://127.0.0.1:8765")
    sensor_interval_s: int = Field(default=30, gt=0)
    shards_per_run: int = Field(
        default=50,
        gt=0,
        description="at most this many shards move in one Dagster run (a partition range of at most this length)",
    )
    lease_ttl_s: float | None = Field(default=None, gt=0, description="shard lease ttl (default 15 minutes)")
    gpu_node_selector: str | None = None
    gpu_image: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        env = os.environ if env is None else env

        def get(name: str) -> str | None:
            value = env.get(PREFIX + name, "").strip()
            return value or None

        raw = {
            "home": get("HOME") or str(Path.cwd() / ".batch_pipeline"),
            "jobs": get("JOBS") or PROJECT_ROOT / "data" / "jobs",
            "prices": get("PRICES") or PROJECT_ROOT / "data" / "prices.yaml",
            "sandbox_url": get("SANDBOX_URL"),
            "sensor_interval_s": get("SENSOR_INTERVAL_S") or 30,
            "shards_per_run": get("SHARDS_PER_RUN") or 50,
            "lease_ttl_s": get("LEASE_TTL_S"),
            "gpu_node_selector": get("GPU_NODE_SELECTOR"),
            "gpu_image": get("GPU_IMAGE"),
        }
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(
                f"${PREFIX}{'.'.join(map(str, e['loc'])).upper()}={e.get('input')!r}: {e['msg']}" for e in exc.errors()
            )
            raise ConfigError(f"invalid environment setting: {problems}") from None
