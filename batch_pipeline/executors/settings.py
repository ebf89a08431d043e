"""What every provider's ``backend.settings`` repeat: where it is, which key, how long to wait, how often to poll.

Each provider's settings model subclasses one of these and adds only what is its own. Keys are named by the
environment variable that holds them, never given in the spec.
"""

from pydantic import BaseModel, ConfigDict, Field

from batch_pipeline.core.spec.quota import AccountSpec, QuotaSpec, Retention
from batch_pipeline.executors.endpoint import SANDBOX_URL_ENV

SANDBOX_POLL_S = 0.2
PROVIDER_POLL_S = 30.0


class ProviderSettings(BaseModel):
    """A provider reached over HTTP: the real service, a configured base URL, or the bundled sandbox."""

    model_config = ConfigDict(extra="forbid")
    sandbox: bool = Field(default=False, description=f"use the bundled sandbox at ${SANDBOX_URL_ENV}")
    base_url: str | None = None
    api_key_env: str | None = Field(default=None, description="the environment variable holding the key")
    timeout_s: float = Field(default=120, gt=0)


class BatchProviderSettings(ProviderSettings):
    """A provider batch API: the SDK's own retries per call, and how often an open batch is polled."""

    max_retries: int = Field(default=4, ge=0)
    poll_interval_s: float | None = Field(
        default=None, gt=0, description=f"default {PROVIDER_POLL_S:g} s; {SANDBOX_POLL_S:g} s on the sandbox"
    )
    find_scan_limit: int = Field(default=1000, gt=0, description="batches scanned when re-attaching after a crash")
    parse_workers: int | None = Field(
        default=None, ge=1, le=32, description="threads parsing a downloaded result file; default: the cores, at most 4"
    )
    quota: QuotaSpec = Field(default_factory=QuotaSpec, description="the account's queue caps (docs/quotas.md)")
    account: str | None = Field(
        default=None,
        description="the capacity ledger's name for this account (default: "
        "api_key_env); jobs naming the same account share its queue",
    )
    accounts: list[AccountSpec] = Field(
        default_factory=list, description="several accounts: shards go to one with room"
    )
    retention: Retention = Field(
        default=Retention.DELETE,
        description="delete: the provider's copies of a shard's input and results go once they are stored",
    )

    def poll_interval(self) -> float:
        return self.poll_interval_s or (SANDBOX_POLL_S if self.sandbox else PROVIDER_POLL_S)
