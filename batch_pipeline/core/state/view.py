"""Read what the driver decides from: the shard summaries and the job's facts (stop, pause, canary, quote)."""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from batch_pipeline.core.control import JobControl
from batch_pipeline.core.golden import canary_passed
from batch_pipeline.core.paths import JobPaths
from batch_pipeline.core.rescue import deadline_near
from batch_pipeline.core.spec import JobSpec
from batch_pipeline.core.state.driver import CanaryStatus, JobFacts, Plan, next_steps
from batch_pipeline.core.state.machine import ShardState
from batch_pipeline.core.state.summary import ShardSummaries, ShardSummary
from batch_pipeline.core.store import Store

QUOTE_MARGIN = timedelta(minutes=2)  # a quote this close to expiry is re-made before spending on it


def canary_status(spec: JobSpec, store: Store, shard_ids: list[str]) -> CanaryStatus:
    if not spec.canary_first or not shard_ids:
        return CanaryStatus(None)
    verdict = canary_passed(spec, store)
    if verdict is None:
        return CanaryStatus(shard_ids[0])
    return CanaryStatus(shard_ids[0], bool(verdict["passed"]), verdict.get("reason", ""))


def quote_fresh(store: Store, job: str, now: datetime | None = None) -> bool:
    quote = store.read_json(JobPaths(job).quote)
    now = now or datetime.now(UTC)
    return bool(quote) and datetime.fromisoformat(quote["expires_at"]) > now + QUOTE_MARGIN


def paused(store: Store, job: str) -> dict | None:
    return store.read_json(JobPaths(job).pause)


@dataclass
class JobView:
    summaries: list[ShardSummary]
    facts: JobFacts

    def plan(self) -> Plan:
        return next_steps(self.summaries, self.facts)


def load_view(spec: JobSpec, store: Store, *, in_flight: frozenset[str] = frozenset(), busy: bool = False,
              batch_ended: Callable[[ShardSummary], bool] | None = None) -> JobView:
    """``batch_ended`` asks the provider about a submitted shard (the sensor polls; the CLI collects inline)."""
    summaries = ShardSummaries(spec, store).all()
    stop = JobControl(store, spec.name).current()
    ended = frozenset(s.shard_id for s in summaries
                      if batch_ended is not None and s.state == ShardState.SUBMITTED and s.shard_id not in in_flight
                      and not stop and batch_ended(s))
    facts = JobFacts(
        canary=canary_status(spec, store, [s.shard_id for s in summaries]),
        stopped=stop["reason"] if stop else None, paused=paused(store, spec.name) is not None,
        quote_fresh=quote_fresh(store, spec.name), deadline_near=deadline_near(spec), has_tail=spec.tail is not None,
        in_flight=in_flight, ended=ended, busy=busy)
    return JobView(summaries, facts)
