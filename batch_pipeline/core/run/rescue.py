"""Tail rescue: when the deadline nears, or a provider batch expires, the unfinished items of a shard
are finished through an online backend at the interactive price (recorded as such in the results).
"""

from datetime import UTC, datetime, timedelta

from batch_pipeline.core.spec.job import JobSpec


def deadline_near(spec: JobSpec, now: datetime | None = None) -> bool:
    if spec.deadline is None or spec.tail is None:
        return False
    now = now or datetime.now(UTC)
    deadline = spec.deadline if spec.deadline.tzinfo else spec.deadline.replace(tzinfo=UTC)
    return now >= deadline - timedelta(minutes=spec.tail.before_deadline_minutes)


def rescue_reason(spec: JobSpec, final_states: list[str], now: datetime | None = None) -> str | None:
    """Why this shard's leftovers should go online now, or None."""
    if spec.tail is None:
        return None
    if deadline_near(spec, now):
        return f"deadline {spec.deadline} is within {spec.tail.before_deadline_minutes} min"
    if spec.tail.on_expiry and "expired" in final_states:
        return "the provider batch expired"
    return None
