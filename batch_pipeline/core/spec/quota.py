"""What a provider account may hold waiting (``backend.settings.quota``), its accounts (``backend.settings.accounts``)
and what is left at the provider after collection (``backend.settings.retention``).

Every figure is the account's own (tier, model, region): read it from the provider's console and set it here, or
leave it out and let the first refusal teach it (core/ledger/capacity.py). A figure of ``None`` is "not capped
as far as we know".
"""

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class QuotaSpec(BaseModel):
    """An account's queue caps, per model where the provider caps per model."""

    model_config = ConfigDict(extra="forbid")
    enqueued_tokens: int | None = Field(
        default=None, gt=0, description="prompt tokens waiting in open batches (OpenAI, Azure, Gemini)"
    )
    enqueued_requests: int | None = Field(default=None, gt=0, description="requests waiting across batches (Anthropic)")
    concurrent_jobs: int | None = Field(
        default=None, gt=0, description="batch jobs submitted or running (Vertex, Bedrock)"
    )
    batches_per_hour: int | None = Field(
        default=None, gt=0, description="batch creates per rolling hour (OpenAI: 2,000)"
    )
    headroom: float = Field(
        default=0.03,
        ge=0,
        lt=0.5,
        description="estimated tokens are reserved this much higher: the provider's own count may differ",
    )

    def configured(self) -> bool:
        return any(
            v is not None
            for v in (self.enqueued_tokens, self.enqueued_requests, self.concurrent_jobs, self.batches_per_hour)
        )


class AccountSpec(BaseModel):
    """One provider account a job may spread its shards over (its key is named by the variable that holds it)."""

    model_config = ConfigDict(extra="forbid")
    api_key_env: str = Field(description="the environment variable holding this account's key")
    name: str | None = Field(
        default=None,
        description="the ledger's name for the account (default: api_key_env); "
        "jobs that name the same account share its queue",
    )
    quota: QuotaSpec = Field(default_factory=QuotaSpec)

    @property
    def label(self) -> str:
        return self.name or self.api_key_env


class Retention(StrEnum):
    DELETE = "delete"  # once a shard's results are stored, its files are deleted at the provider
    KEEP = "keep"


RetentionSetting = Literal["delete", "keep"]
