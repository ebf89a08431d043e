"""Every open batch's age against its provider's ceilings: the completion window (OpenAI and Anthropic 24 h,
Gemini 48 h: then the batch expires and what did not finish is retried) and the retention of its results (OpenAI
deletes output files 30 days after completion, Anthropic results 29 days after creation: a batch collected after
that has lost answers that were billed). ``status`` and the report show them, with a warning while there is time.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from batch_pipeline.core.ledger.attempts import SubmittedRecord

WARN_WINDOW_SHARE = 0.75  # warn once a batch has used this share of its completion window
WARN_RETENTION_SHARE = 0.8  # ... or this share of its provider's retention


@dataclass(frozen=True)
class Ceilings:
    provider: str
    window: timedelta | None = None
    retention: timedelta | None = None
    retention_from: str = "completed"  # "completed" or "created": when the provider's retention clock starts


@dataclass(frozen=True)
class OpenBatchAge:
    shard_id: str
    batch_id: str
    submitted_at: datetime
    age: timedelta
    expires_at: datetime | None  # the end of its completion window
    deleted_from: datetime | None  # the earliest moment its results may be deleted (if it completed at once)
    warning: str | None

    def as_dict(self) -> dict:
        return {
            "shard_id": self.shard_id,
            "batch_id": self.batch_id,
            "submitted_at": self.submitted_at.isoformat(),
            "age_h": round(self.age.total_seconds() / 3600, 2),
            "expires_at": self.expires_at.isoformat() if self.expires_at else None,
            "results_deleted_from": self.deleted_from.isoformat() if self.deleted_from else None,
            "warning": self.warning,
        }


def _hours(d: timedelta) -> str:
    h = d.total_seconds() / 3600
    return f"{h / 24:.1f} days" if h >= 48 else f"{h:.1f} h"


def batch_age(
    shard_id: str, batch_id: str, submitted_at: datetime, ceilings: Ceilings, job: str, now: datetime | None = None
) -> OpenBatchAge:
    now = now or datetime.now(UTC)
    age = now - submitted_at
    expires = submitted_at + ceilings.window if ceilings.window else None
    deleted = submitted_at + ceilings.retention if ceilings.retention else None
    warning = None
    if deleted is not None and age >= ceilings.retention * WARN_RETENTION_SHARE:  # type: ignore[operator]
        assert ceilings.retention is not None
        when = "has passed" if now >= deleted else f"is {_hours(deleted - now)} away"
        warning = (
            f"batch {batch_id} of shard {shard_id} is {_hours(age)} old and not collected: {ceilings.provider} "
            f"deletes its results {_hours(ceilings.retention)} after it {ceilings.retention_from}, which "
            f"{when}; collect it now (`batch-pipeline run {job}`)"
        )
    elif expires is not None and age >= ceilings.window * WARN_WINDOW_SHARE:  # type: ignore[operator]
        assert ceilings.window is not None
        warning = (
            f"batch {batch_id} of shard {shard_id} has run {_hours(age)} of its {_hours(ceilings.window)} "
            f"completion window; at {expires.isoformat(timespec='minutes')} the provider ends it (what "
            "finished is kept, the rest is sent again)"
        )
    return OpenBatchAge(shard_id, batch_id, submitted_at, age, expires, deleted, warning)


def open_batch_ages(
    open_batches: Iterable[tuple[str, SubmittedRecord]],
    ceilings: Ceilings | None,
    job: str,
    now: datetime | None = None,
) -> list[OpenBatchAge]:
    """(shard, submitted record) of every open batch -> its age against the ceilings, oldest first."""
    if ceilings is None:
        return []
    out = []
    for shard_id, submitted in open_batches:
        try:
            at = datetime.fromisoformat(submitted.at)
        except ValueError:
            continue
        out.append(batch_age(shard_id, submitted.batch_id, at, ceilings, job, now))
    return sorted(out, key=lambda a: a.submitted_at)
