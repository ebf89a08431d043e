"""Per-shard summaries: what the driver decides from, written whenever a shard's attempt log changes.

A summary holds the shard's state, its open attempt (if any), its item counts by state and its spend. It is
recomputed from that one shard's attempt log and result parts (never the whole job), so a decision over a
10,000-shard job reads 10,000 small JSON objects instead of every result row. A summary that is missing
(an older store, a crash between a record and its summary) is rebuilt on read; a stale one is repaired by
``refresh`` the next time the shard is touched, and the state it moves to is checked against the machine.

A summary is a typed record with a ``version``: 1 is the shape written before it carried one (no ``version`` key)
and since. It stays a dataclass (the driver's tests build thousands positionally); its JSON is read and written by
one pydantic ``TypeAdapter``, which checks the types (the open attempt's handle is a ``SubmittedRecord``) and
ignores unknown keys: a summary is a cache of the shard's own records, recomputed by ``refresh``, so a newer
release's extra fields are never needed to decide.
"""

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import polars as pl
from pydantic import TypeAdapter

from batch_pipeline.core.ledger.attempts import Attempt, AttemptLog, SubmittedRecord
from batch_pipeline.core.ledger.fallback import Stage, is_fallback_row, staged_item_states
from batch_pipeline.core.ledger.machine import ShardState, check_summary_move
from batch_pipeline.core.ledger.reconcile import DEAD, INVALID, MISSING, RETRYABLE, VALID, Counts
from batch_pipeline.core.ledger.replay import Replays
from batch_pipeline.core.ledger.result_parts import read_results
from batch_pipeline.core.manifest.shards import Manifest
from batch_pipeline.core.money.retry_cap import RetryCosts, retry_costs
from batch_pipeline.core.quality.golden import GoldenProbes
from batch_pipeline.core.run.threads import ordered_map
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store

log = logging.getLogger(__name__)

STATE_COLUMNS = [
    "request_id",
    "attempt",
    "status",
    "error_class",
    "error_code",
    "error_message",
    "cost_usd",
    "model",
    "backend",
]


@dataclass
class OpenAttempt:
    number: int
    key: str
    backend: str | None
    intent_at: str
    canary: bool
    submitted: SubmittedRecord | None  # the provider handle, once the provider accepted the batch
    stage: str = Stage.PRIMARY.value  # the fallback's attempts are collected by the fallback's runner


SUMMARY_VERSION = 1


@dataclass(kw_only=True)
class ShardSummary(Counts):
    """A shard's counts (``Counts``: the reconciliation's, stored flat) and what the driver decides from."""

    shard_id: str
    state: ShardState
    attempts: int = 0
    spend_usd: float = 0.0
    canary_done: bool = False  # a canary attempt of this shard has been collected
    last_final_state: str | None = None  # the provider's final state of the last collected attempt
    first_try_cost: float = 0.0  # the retry-spend cap's inputs (core/money/retry_cap.py), kept per shard
    first_tries: int = 0
    retry_cost: float = 0.0
    retry_tries: int = 0
    fallback_pending: int = 0  # retryable items handed to the fallback model (core/ledger/fallback.py)
    fallback_valid: int = 0  # items the fallback answered
    pending_est_tokens: int = 0  # the manifest's input estimate of the items still to send (admission)
    possibly_billed_usd: float = 0.0  # requests a kill left in flight (sent, no answer): at their highest cost
    open: OpenAttempt | None = None
    updated_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat())
    version: int = SUMMARY_VERSION

    @property
    def retry_costs(self) -> RetryCosts:
        return RetryCosts(self.first_try_cost, self.first_tries, self.retry_cost, self.retry_tries)

    def as_dict(self) -> dict[str, Any]:  # type: ignore[override]  # every field, not the counts alone
        return _SUMMARY.dump_python(self, mode="json")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ShardSummary":
        return _SUMMARY.validate_python(d)


_SUMMARY = TypeAdapter(ShardSummary)


def _open_attempt(attempts: list[Attempt]) -> OpenAttempt | None:
    live = [a for a in attempts if a.open]
    if not live:
        return None
    a = live[-1]
    return OpenAttempt(a.number, a.key, a.backend, a.intent.at, a.canary, a.submitted, a.intent.stage)


def derive_state(open_attempt: OpenAttempt | None, attempts: int, retryable: int) -> ShardState:
    if open_attempt is not None:
        return ShardState.SUBMITTED if open_attempt.submitted else ShardState.INTENT
    if attempts == 0:
        return ShardState.NEW
    return ShardState.COLLECTED if retryable else ShardState.SETTLED


def shard_item_states(
    spec: JobSpec, store: Store, shard_id: str, results: pl.DataFrame, items: pl.DataFrame | None = None
) -> pl.DataFrame:
    """Every item of one shard with its state (``reconcile.item_states``) and stage (primary or fallback,
    ``core/ledger/fallback.py``), this shard's replays applied. ``items`` (request_id, shard_id, ...) is read from
    the manifest when not given; probe rows are the caller's to drop."""
    if items is None:
        frame = pl.from_arrow(Manifest(spec.name, store).shard_items(shard_id, ["request_id", "shard_id"]))
        assert isinstance(frame, pl.DataFrame)
        items = frame
    if spec.fallback is not None and results.height and not {"model", "backend"} <= set(results.columns):
        who = read_results(store, spec.name, shard_id, ["request_id", "attempt", "model", "backend"])
        results = results.join(who, on=["request_id", "attempt"], how="left")
    return staged_item_states(spec, items, results, Replays(store, spec.name).table(shard_id))


def _stage_counts(states: pl.DataFrame) -> dict[str, int]:
    """The fallback stage's retryable (pending) and answered (valid) items."""
    fb = states.filter(pl.col("stage") == Stage.FALLBACK.value)
    return {
        "pending": fb.filter(pl.col("state").is_in(RETRYABLE)).height,
        "valid": fb.filter(pl.col("state") == VALID).height,
    }


class ShardSummaries:
    """Read and write the summaries of one job."""

    def __init__(self, spec: JobSpec, store: Store):
        self.spec, self.store, self.job = spec, store, spec.name
        self.paths = JobPaths(spec.name)
        self.manifest = Manifest(spec.name, store)
        self._probe_ids: pl.DataFrame | None = None

    @property
    def probe_ids(self) -> pl.DataFrame | None:
        """Golden probes are paid but are not items: left out of the counts (read when first needed)."""
        if self.spec.quality is None:
            return None
        if self._probe_ids is None:
            self._probe_ids = GoldenProbes(self.spec, self.store).all_probe_ids().select("request_id")
        return self._probe_ids

    def compute(self, shard_id: str) -> ShardSummary:
        """From this shard's own records: its attempt log, its result parts and its manifest items."""
        attempts = AttemptLog(self.store, self.job, shard_id).all(request_ids=False)
        with_est = pl.from_arrow(self.manifest.shard_items(shard_id, ["request_id", "shard_id", "est_input_tokens"]))
        assert isinstance(with_est, pl.DataFrame)
        items = with_est.select("request_id", "shard_id")
        results = read_results(self.store, self.job, shard_id, STATE_COLUMNS)
        spend = float(results["cost_usd"].sum() or 0.0) if results.height else 0.0
        # the fallback's spend is its own allowance, not retry spend of the primary
        costs = retry_costs(results.filter(~is_fallback_row(self.spec)) if results.height else results)
        probes = self.probe_ids if results.height else None
        if probes is not None and probes.height:
            self._probe_ids = None  # a shard's probes are registered at its first attempt: read them afresh next time
            results = results.join(probes, on="request_id", how="anti")
        states = shard_item_states(self.spec, self.store, shard_id, results.drop("cost_usd"), items)
        counts = dict(states.group_by("state").len().iter_rows())
        staged = _stage_counts(states)
        opened = _open_attempt(attempts)
        closed = [a for a in attempts if not a.open]
        collected = [a for a in closed if a.collected is not None]
        retryable = sum(counts.get(state, 0) for state in RETRYABLE)
        pending = (
            with_est
            if not attempts
            else with_est.join(
                states.filter(pl.col("state").is_in(RETRYABLE)).select("request_id"), on="request_id", how="semi"
            )
        )
        return ShardSummary(
            shard_id=shard_id,
            state=derive_state(opened, len(attempts), retryable),
            expected=items.height,
            valid=counts.get(VALID, 0),
            invalid=counts.get(INVALID, 0),
            missing=counts.get(MISSING, 0),
            dead_lettered=counts.get(DEAD, 0),
            attempts=len(attempts),
            spend_usd=round(spend, 10),
            canary_done=any(a.canary for a in collected),
            first_try_cost=round(costs.first_cost, 10),
            first_tries=costs.first_tries,
            retry_cost=round(costs.retry_cost, 10),
            retry_tries=costs.retry_tries,
            last_final_state=collected[-1].collected.state if collected and collected[-1].collected else None,
            open=opened,
            fallback_pending=staged.get("pending", 0),
            fallback_valid=staged.get("valid", 0),
            pending_est_tokens=int(pending["est_input_tokens"].sum() or 0),
            possibly_billed_usd=round(
                sum(a.abandoned.possibly_billed_usd or 0.0 for a in attempts if a.abandoned is not None), 10
            ),
        )

    def refresh(self, shard_id: str) -> ShardSummary:
        """Recompute and store one summary; a move the state machine does not allow raises IllegalTransition."""
        new = self.compute(shard_id)
        old = self.read(shard_id)
        if old is not None:
            check_summary_move(shard_id, old.state, new.state)
        self.store.write_json(self.paths.shard_summary(shard_id), new.as_dict())
        return new

    def read(self, shard_id: str) -> ShardSummary | None:
        raw = self.store.read_json(self.paths.shard_summary(shard_id))
        return ShardSummary.from_dict(raw) if raw else None

    def all(self, shard_ids: list[str] | None = None) -> list[ShardSummary]:
        """Every shard's summary in shard order; missing ones are computed and stored."""
        shard_ids = self.manifest.shard_ids() if shard_ids is None else shard_ids
        # serial on local disk (faster than threads there); threads hide the per-object latency of S3
        read = list(ordered_map(self.read, shard_ids, workers=1 if self.store.is_local else 16, ahead=64))
        out = []
        for shard_id, summary in zip(shard_ids, read, strict=True):
            if summary is None:  # written once, never over a summary that a lease holder refreshed meanwhile
                summary = self.compute(shard_id)
                self.store.create_json_exclusive(self.paths.shard_summary(shard_id), summary.as_dict())
            out.append(summary)
        return out
