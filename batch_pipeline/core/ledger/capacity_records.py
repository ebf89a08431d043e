"""What the capacity ledger counts and answers with: the dimensions of an account's queue, a batch's need, one
holding, the limits in force and a snapshot of the queue (what is in use, what is free, what blocks a need)."""

import re
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

ROOT = "capacity"  # the ledgers' folder under the storage root


class Dimension(StrEnum):
    TOKENS = "tokens"  # enqueued prompt tokens (OpenAI, Azure, Gemini)
    REQUESTS = "requests"  # requests waiting (Anthropic)
    JOBS = "jobs"  # batch jobs submitted or running (Vertex, Bedrock)
    PER_HOUR = "per_hour"  # batch creates per rolling hour (OpenAI)

    @property
    def label(self) -> str:
        return {
            "tokens": "enqueued tokens",
            "requests": "enqueued requests",
            "jobs": "open batch jobs",
            "per_hour": "batch creates in the last hour",
        }[self.value]


QUOTA_FIELDS = {
    Dimension.TOKENS: "enqueued_tokens",
    Dimension.REQUESTS: "enqueued_requests",
    Dimension.JOBS: "concurrent_jobs",
    Dimension.PER_HOUR: "batches_per_hour",
}


@dataclass(frozen=True)
class CapacityScope:
    provider: str
    account: str
    model: str = "*"

    @property
    def rel(self) -> str:
        return f"{ROOT}/{_safe(self.provider)}/{_safe(self.account)}/{_safe(self.model)}"

    def describe(self) -> str:
        model = "" if self.model == "*" else f", model {self.model}"
        return f"{self.provider} account {self.account}{model}"


def _safe(part: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", part) or "_"


@dataclass(frozen=True)
class Need:
    """What one batch holds in the queue while it is open."""

    tokens: int = 0
    requests: int = 0
    jobs: int = 1

    def get(self, dim: Dimension) -> int:
        return {
            Dimension.TOKENS: self.tokens,
            Dimension.REQUESTS: self.requests,
            Dimension.JOBS: self.jobs,
            Dimension.PER_HOUR: self.jobs,
        }[dim]

    def __add__(self, other: "Need") -> "Need":
        return Need(self.tokens + other.tokens, self.requests + other.requests, self.jobs + other.jobs)


NOTHING = Need(0, 0, 0)


@dataclass(frozen=True)
class Holding:
    number: int
    job: str
    shard_id: str
    attempt: int
    need: Need
    at: datetime
    batch_id: str | None = None
    bound_at: datetime | None = None


@dataclass(frozen=True)
class Limits:
    """The limit in force per dimension (None: not capped as far as we know) and where it came from."""

    values: dict[Dimension, int] = field(default_factory=dict)
    sources: dict[Dimension, str] = field(default_factory=dict)

    @property
    def any(self) -> bool:
        return bool(self.values)


@dataclass(frozen=True)
class Snapshot:
    scope: CapacityScope
    limits: Limits
    holdings: tuple[Holding, ...]
    created_last_hour: int = 0

    @property
    def used(self) -> Need:
        return sum((h.need for h in self.holdings), NOTHING)

    def in_use(self, dim: Dimension) -> int:
        return self.created_last_hour if dim == Dimension.PER_HOUR else self.used.get(dim)

    def free(self, dim: Dimension) -> int | None:
        limit = self.limits.values.get(dim)
        return None if limit is None else max(limit - self.in_use(dim), 0)

    def blocking(self, need: Need) -> Dimension | None:
        """The first dimension ``need`` does not fit in, or None when it fits."""
        for dim, limit in self.limits.values.items():
            if need.get(dim) and self.in_use(dim) + need.get(dim) > limit:
                return dim
        return None

    def fits(self, need: Need) -> bool:
        return self.blocking(need) is None

    def describe(self, dim: Dimension | None = None) -> str:
        """e.g. "1.9M of 2.0M enqueued tokens in use by 3 batches (jobs triage, embed)"."""
        dims = [dim] if dim is not None else list(self.limits.values)
        parts = [
            f"{_short(self.in_use(d))} of {_short(self.limits.values[d])} {d.label}"
            + (" (learned from a refusal)" if self.limits.sources.get(d, "").startswith("learned") else "")
            for d in dims
            if d in self.limits.values
        ]
        jobs = sorted({h.job for h in self.holdings})
        held = (
            f" in use by {len(self.holdings)} batch(es) (job{'s' if len(jobs) > 1 else ''} {', '.join(jobs)})"
            if self.holdings
            else ""
        )
        return f"{'; '.join(parts) or 'no limit'}{held} on {self.scope.describe()}"


def _short(n: int) -> str:
    for unit, size in (("M", 1_000_000), ("k", 1_000)):
        if abs(n) >= size:
            return f"{n / size:.1f}{unit}".replace(".0" + unit, unit)
    return str(n)
