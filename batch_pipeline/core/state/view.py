"""Read what the driver decides from: the shard summaries and the job's facts (stop, pause, canary, quote)."""

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime

from batch_pipeline.core.errors import ConfigError
from batch_pipeline.core.ledger.admission import Room
from batch_pipeline.core.ledger.capacity import CapacityLedger, Need
from batch_pipeline.core.ledger.control import JobControl, PauseRecord
from batch_pipeline.core.ledger.fallback import fallback_may_use_tail
from batch_pipeline.core.ledger.machine import ShardState
from batch_pipeline.core.manifest.read import canary_of
from batch_pipeline.core.manifest.shards import Manifest
from batch_pipeline.core.money.quote import quote_current
from batch_pipeline.core.money.quote_record import read_quote
from batch_pipeline.core.quality.golden import canary_passed
from batch_pipeline.core.run.admission import TokenCounts
from batch_pipeline.core.run.rescue import deadline_near
from batch_pipeline.core.run.summary import ShardSummaries, ShardSummary
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.state.driver import CanaryStatus, JobFacts, Plan, next_steps
from batch_pipeline.core.store import Store


def canary_status(spec: JobSpec, store: Store, shard_ids: list[str]) -> CanaryStatus:
    canary = canary_of(shard_ids)
    if not spec.canary_first or canary is None:
        return CanaryStatus(None)
    verdict = canary_passed(spec, store)
    if verdict is None:
        return CanaryStatus(canary, size=spec.canary.size)
    return CanaryStatus(canary, verdict.passed, verdict.reason, size=spec.canary.size)


def quote_fresh(store: Store, job: str, now: datetime | None = None) -> bool:
    return quote_current(read_quote(store, job), now)


def paused(store: Store, job: str) -> PauseRecord | None:
    return JobControl(store, job).paused()


@dataclass
class JobView:
    summaries: list[ShardSummary]
    facts: JobFacts

    def plan(self) -> Plan:
        return next_steps(self.summaries, self.facts)


def load_facts(
    spec: JobSpec,
    store: Store,
    shard_ids: list[str],
    *,
    in_flight: frozenset[str] = frozenset(),
    ended: frozenset[str] = frozenset(),
    busy: bool = False,
    min_batch: int = 0,
    fallback_min_batch: int = 0,
) -> JobFacts:
    """``min_batch``, ``fallback_min_batch``: the job's backend's and the fallback's backend's minimum requests
    per batch (``executors.registry.batch_minimums``)."""
    stop = JobControl(store, spec.name).current()
    return JobFacts(
        canary=canary_status(spec, store, shard_ids),
        stopped=stop.reason if stop else None,
        paused=paused(store, spec.name) is not None,
        quote_fresh=quote_fresh(store, spec.name),
        deadline_near=deadline_near(spec),
        has_tail=spec.tail is not None,
        in_flight=in_flight,
        ended=ended,
        busy=busy,
        min_batch=min_batch,
        held=JobControl(store, spec.name).shard_holds(),
        fallback_min_batch=fallback_min_batch,
        fallback_tail=fallback_may_use_tail(spec),
    )


def capacity_facts(
    spec: JobSpec, store: Store, ledgers: list[CapacityLedger], summaries: list[ShardSummary]
) -> tuple[Room | None, dict[str, Need]]:
    """The account queues' free room and each sendable shard's need, when a queue has a limit we know."""
    snapshots = [ledger.snapshot() for ledger in ledgers]
    if not any(s.limits.any for s in snapshots):
        return None, {}
    counts = TokenCounts(store, spec, max(ledger.quota.headroom for ledger in ledgers))
    needs = {}
    for s in summaries:
        if s.state in (ShardState.NEW, ShardState.COLLECTED):
            n = s.expected if s.state == ShardState.NEW else s.retryable
            needs[s.shard_id] = Need(counts.total(s.pending_est_tokens, n), n, 1)
    return Room(snapshots), needs


def release_ended(
    spec: JobSpec, ledgers: list[CapacityLedger], submitted: list[ShardSummary], ended: frozenset[str]
) -> None:
    """A batch the provider has ended no longer counts in its queue: its place is released as soon as a poll sees
    it, before its results are collected, so the same plan already sends a waiting shard into the room (the
    collection's own release finds it released: idempotent)."""
    for s in submitted:
        if s.shard_id in ended and s.open is not None:
            for ledger in ledgers:
                ledger.release_attempt(spec.name, s.shard_id, s.open.number, "the provider ended the batch")


def load_view(
    spec: JobSpec,
    store: Store,
    *,
    in_flight: frozenset[str] = frozenset(),
    busy: bool = False,
    batch_ended: Callable[[list[ShardSummary]], set[str]] | None = None,
    min_batch: int = 0,
    fallback_min_batch: int = 0,
    capacity: list[CapacityLedger] | None = None,
    waits_inline: bool = False,
) -> JobView:
    """``batch_ended`` asks the provider which of the submitted shards have ended (the sensor polls them, at most
    a bounded number per tick). ``waits_inline``: the caller's collect run waits on open batches itself (the CLI's
    passes), so an open batch is a COLLECT step, not a wait. ``capacity``: the ledger of the account's queue, so the
    plan says which shards wait for room."""
    summaries = ShardSummaries(spec, store).all()
    submitted = [s for s in summaries if s.state == ShardState.SUBMITTED and s.shard_id not in in_flight]
    stopped = JobControl(store, spec.name).current() is not None
    ended = frozenset(batch_ended(submitted)) if batch_ended is not None and submitted and not stopped else frozenset()
    facts = load_facts(
        spec,
        store,
        [s.shard_id for s in summaries],
        in_flight=in_flight,
        ended=ended,
        busy=busy,
        min_batch=min_batch,
        fallback_min_batch=fallback_min_batch,
    )
    release_ended(spec, capacity or [], submitted, ended)
    room, needs = capacity_facts(spec, store, capacity or [], summaries)
    if room is not None:
        facts = replace(facts, room=room, needs=needs)
    if waits_inline:
        facts = replace(facts, waits_inline=True)
    return JobView(summaries, facts)


def load_shard(
    spec: JobSpec, store: Store, shard_id: str, min_batch: int = 0, fallback_min_batch: int = 0
) -> tuple[ShardSummary, JobFacts]:
    """One shard's summary and the job's facts: what a shard run needs to take its step, without reading every
    other shard's summary."""
    summaries = ShardSummaries(spec, store)
    shard_ids = Manifest(spec.name, store).shard_ids()
    if shard_id not in shard_ids:
        raise ConfigError(f"shard {shard_id} is not in the manifest of job {spec.name}")
    summary = summaries.read(shard_id) or summaries.refresh(shard_id)
    return summary, load_facts(spec, store, shard_ids, min_batch=min_batch, fallback_min_batch=fallback_min_batch)
