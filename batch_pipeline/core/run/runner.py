"""Drive one shard attempt through any executor: intents, re-attachment, validation, flushes.

Resuming is the normal path, not a special case: every call derives what is left from the store.
``submit`` sends only items that are neither valid nor dead-lettered, and never while an earlier
attempt of the shard is still open (it re-attaches to that batch instead, asking the provider by key
when the crash came between "accepted" and "recorded"). ``collect`` waits for the batch to end and
appends validated results; a crash mid-collection just collects the same batch again.
"""

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from batch_pipeline.core.errors import QuotaError, SystemicError, TransientError
from batch_pipeline.core.ledger.attempts import AttemptLog
from batch_pipeline.core.ledger.control import JobControl
from batch_pipeline.core.ledger.executor import BatchExecutor, RequestPlan, ShardWork, StreamExecutor
from batch_pipeline.core.ledger.fallback import Stage
from batch_pipeline.core.ledger.outcomes import CollectOutcome, SubmitOutcome  # noqa: F401  (CollectOutcome: callers)
from batch_pipeline.core.ledger.reconcile import DEAD, VALID, spends_budget
from batch_pipeline.core.ledger.replay import Replays
from batch_pipeline.core.ledger.result_parts import read_results
from batch_pipeline.core.manifest.shards import Manifest
from batch_pipeline.core.money.retry_cap import RetryCosts
from batch_pipeline.core.pricing.cost import Price
from batch_pipeline.core.run.admission import Admission, Admitted
from batch_pipeline.core.run.collect import CollectShape
from batch_pipeline.core.run.faults import crash_point
from batch_pipeline.core.run.lease import Lease, LeaseHeldError, acquire, default_owner
from batch_pipeline.core.run.stream import StreamShape
from batch_pipeline.core.run.summary import ShardSummaries, ShardSummary, shard_item_states
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.store import Store

log = logging.getLogger(__name__)

STATE_COLUMNS = ["request_id", "attempt", "status", "error_class", "error_code", "error_message", "model", "backend"]


class ShardRunner(StreamShape, CollectShape):
    """The shard runner: the batch shape's submission here, its collection in ``collect.py``, the stream shape in
    ``stream.py``."""

    def __init__(
        self,
        spec: JobSpec,
        store: Store,
        executor: BatchExecutor | StreamExecutor,
        price: Price | None,
        pricing: str = "batch",
        owner: str | None = None,
        before_spend: Callable[[str, pa.Table], None] | None = None,
        extra_items: Callable[[str, int], pa.Table | None] | None = None,
        stage: Stage = Stage.PRIMARY,
    ):
        self.spec, self.store, self.executor, self.price, self.pricing = spec, store, executor, price, pricing
        self.manifest = Manifest(spec.name, store)
        self.plan = RequestPlan.from_spec(spec)
        self.control = JobControl(store, spec.name)
        self.owner = owner or default_owner()
        self.before_spend = before_spend  # e.g. the budget guard: raises to refuse a paid call
        self.extra_items = extra_items  # e.g. golden probes: (shard, attempt) -> request_id, user_prompt
        self.stage = stage  # primary, or the fallback model (sends only the items handed to it)
        self.summaries = ShardSummaries(spec, store)
        self._summaries_cache: tuple[float, list[ShardSummary]] | None = None
        # the account's queue: every batch is created inside a reservation that fits (core/run/admission.py)
        self.admission = Admission(store, spec, executor, int(getattr(executor, "min_requests_per_batch", 0) or 0))

    def _changed(self, shard_id: str) -> ShardSummary:
        """Refresh the shard's summary after every record: the driver decides from it."""
        return self.summaries.refresh(shard_id)

    # -- what is left -----------------------------------------------------------------------------------
    def pending_items(self, shard_id: str) -> pa.Table:
        """Items of the shard that are neither valid nor dead-lettered, with their prompts."""
        return self._pending(shard_id, read_results(self.store, self.spec.name, shard_id, STATE_COLUMNS))

    def _pending(self, shard_id: str, results: pl.DataFrame) -> pa.Table:
        items = self.manifest.shard_items(shard_id, ["request_id", "shard_id", "user_prompt"])
        if results.height == 0:
            return items.select(["request_id", "user_prompt"])
        frame = pl.from_arrow(items)
        assert isinstance(frame, pl.DataFrame)
        states = shard_item_states(self.spec, self.store, shard_id, results, frame)
        done = states.filter(pl.col("state").is_in([VALID, DEAD]) | (pl.col("stage") != self.stage.value)).select(
            "request_id"
        )
        return frame.join(done, on="request_id", how="anti").select("request_id", "user_prompt").to_arrow()

    def _key(self, shard_id: str, attempt: int) -> str:
        return f"{self.spec.name}:{shard_id}:{attempt}"

    # -- batch shape ----------------------------------------------------------------------------------------
    def submit(self, shard_id: str, only: list[str] | None = None, canary: bool = False) -> SubmitOutcome:
        """Send the shard's pending items (or those of ``only``, e.g. the canary sample) once, under the shard's
        lease; re-attach to an open batch instead."""
        executor = self.executor
        assert isinstance(executor, BatchExecutor)
        self.control.ensure_running()
        with acquire(self.store, self.spec.name, shard_id, self.owner) as lease:
            attempts = AttemptLog(self.store, self.spec.name, shard_id)
            live = self._resolve_open(shard_id, executor, attempts)
            if live is not None:
                return live
            started = self._start_attempt(shard_id, attempts, lease, executor.name, only, canary)
            if started is None:
                return SubmitOutcome(shard_id, None, 0, None)
            work, holding = started
            try:
                handle = self._guard(lambda: executor.submit(work))  # a crash here is repaired by find() next time
            except QuotaError as exc:  # "not now": nothing was billed; the shard waits for room
                note = self.admission.refused(holding, exc)
                attempts.record(
                    work.attempt,
                    "abandoned",
                    {
                        "reason": f"refused by the provider: {note}",
                        "refused": {"dimension": exc.dimension, "limit": exc.limit, "code": exc.code},
                    },
                )
                self._changed(shard_id)
                log.warning("shard %s: attempt %d refused for capacity: %s", shard_id, work.attempt, note)
                return SubmitOutcome(shard_id, work.attempt, 0, None, refused=note)
            crash_point("after_create")
            attempts.record(work.attempt, "submitted", handle.as_dict())
            self.admission.bound(holding, handle.batch_id)
            self._changed(shard_id)
            log.info(
                "shard %s: attempt %d submitted %d requests as %s",
                shard_id,
                work.attempt,
                work.items.num_rows,
                handle.batch_id,
            )
            return SubmitOutcome(shard_id, work.attempt, work.items.num_rows, handle)

    def resolve(self, shard_id: str) -> SubmitOutcome | None:
        """Settle the shard's open attempts and send nothing new (the driver decides what the next attempt is):
        a stream attempt left open by a crash is closed (its flushed results are kept); a batch intent is looked
        up at the provider. Returns the re-attached batch, if any."""
        with acquire(self.store, self.spec.name, shard_id, self.owner):
            attempts = AttemptLog(self.store, self.spec.name, shard_id)
            if isinstance(self.executor, BatchExecutor):
                return self._resolve_open(shard_id, self.executor, attempts)
            for attempt in attempts.all():
                if attempt.open and not attempt.submitted:  # its journal replayed first: paid answers kept
                    self.settle_interrupted(shard_id, attempts, attempt)
            return None

    def _resolve_open(self, shard_id: str, executor: BatchExecutor, attempts: AttemptLog) -> SubmitOutcome | None:
        """Settle every open attempt before anything new is sent: a submitted one is re-attached; an intent with
        no submission (a crash between the two) is looked up at the provider (``find``) and re-attached when the
        provider has it, else closed once the executor's grace period (``find_grace_s``) has passed."""
        for attempt in attempts.all():
            if not attempt.open:
                continue
            if attempt.submitted:
                log.info(
                    "shard %s: attempt %d already submitted as %s; re-attaching",
                    shard_id,
                    attempt.number,
                    attempt.submitted.batch_id,
                )
                return SubmitOutcome(
                    shard_id,
                    attempt.number,
                    len(attempt.request_ids),
                    attempt.submitted.handle(),
                    reattached=True,
                )
            if attempt.backend not in (None, executor.name):
                attempts.record(
                    attempt.number, "abandoned", {"reason": f"interrupted {attempt.backend} run; flushed results kept"}
                )
                self.admission.release(shard_id, attempt.number, "attempt closed")
                self._changed(shard_id)
                continue
            found = self._guard(
                partial(
                    executor.find,
                    attempt.key,
                    request_ids=attempt.request_ids,
                    not_before=attempt.intent.at,
                )
            )
            if found is not None:
                log.warning(
                    "shard %s: attempt %d was accepted by the provider as %s but not recorded; re-attaching",
                    shard_id,
                    attempt.number,
                    found.batch_id,
                )
                attempts.record(attempt.number, "submitted", {**found.as_dict(), "reattached": True})
                self.admission.reattached(
                    shard_id,
                    attempt.number,
                    attempt.request_ids,
                    found.batch_id,
                    found.account,
                    attempt.intent.capacity,
                )
                self._changed(shard_id)
                return SubmitOutcome(shard_id, attempt.number, len(attempt.request_ids), found, reattached=True)
            age = (datetime.now(UTC) - datetime.fromisoformat(attempt.intent.at)).total_seconds()
            grace = float(getattr(executor, "find_grace_s", 0.0))
            if age < grace:
                raise TransientError(
                    f"shard {shard_id}: attempt {attempt.number} has an intent {age:.0f} s old and "
                    f"the provider shows no batch yet; asking again after {grace:.0f} s",
                    retry_after_s=grace - age,
                )
            attempts.record(attempt.number, "abandoned", {"reason": "the provider has no batch for this key"})
            self.admission.release(shard_id, attempt.number, "nothing was created at the provider")
            self._changed(shard_id)
        return None

    def _start_attempt(
        self,
        shard_id: str,
        attempts: AttemptLog,
        lease: Lease,
        backend: str,
        only: list[str] | None = None,
        canary: bool = False,
    ) -> tuple[ShardWork, Admitted | None] | None:
        """What is left, past the spend checks and inside a reservation of the account's queue (all of it or the
        part that fits), claimed under the lease with an intent record; None if nothing is."""
        results = read_results(self.store, self.spec.name, shard_id, STATE_COLUMNS)  # read once for both checks
        pending = self._pending(shard_id, results)
        if only is not None:
            pending = pending.filter(pc.is_in(pending.column("request_id"), value_set=pa.array(only, pa.string())))
        number = attempts.next_number()
        extra = self._extra(shard_id, number)
        if pending.num_rows == 0 and (not canary or extra is None):
            return None
        self._check_retry_cap(shard_id, pending, results)
        if self.before_spend:
            self.before_spend(shard_id, pending)
        lease.check("reserve room in the account's queue")
        pending, holding = self.admission.admit(shard_id, number, pending, extra)  # QuotaWait when nothing fits
        crash_point("after_reserve")
        work = ShardWork(
            self.spec.name,
            shard_id,
            number,
            self._key(shard_id, number),
            self._plan(shard_id),
            pending,
            account=holding.account if holding is not None else None,
        )
        lease.check("start an attempt")
        if not attempts.create_intent(
            number,
            {
                "key": work.key,
                "backend": backend,
                "lease_token": lease.token,
                "request_ids": work.request_ids,
                "requests": pending.num_rows,
                "canary": canary,
                "stage": self.stage.value,
                "capacity": holding.holding.number if holding is not None else None,
                "account": work.account,
            },
        ):
            if holding is not None:
                self.admission.release(shard_id, number, "the attempt was claimed by another run")
            raise LeaseHeldError(f"shard {shard_id}: attempt {number} was claimed by another run")
        crash_point("after_intent")
        self._changed(shard_id)
        return work, holding

    def _job_summaries(self) -> list[ShardSummary]:
        """Every shard's summary, read at most every 30 s by one runner (a ranged run submits many shards)."""
        now = time.monotonic()
        if self._summaries_cache is None or now - self._summaries_cache[0] > 30:
            self._summaries_cache = (now, self.summaries.all())
        return self._summaries_cache[1]

    def _plan(self, shard_id: str) -> RequestPlan:
        """The job's request plan, with the larger ``max_tokens`` a replay granted this shard (if any)."""
        granted = Replays(self.store, self.spec.name).max_tokens(shard_id)
        if granted is None or self.plan.sampling is None or granted <= self.plan.sampling.max_tokens:
            return self.plan
        return replace(self.plan, sampling=self.plan.sampling.model_copy(update={"max_tokens": granted}))

    def _extra(self, shard_id: str, attempt: int) -> pa.Table | None:
        extra = self.extra_items(shard_id, attempt) if self.extra_items else None
        return None if extra is None or extra.num_rows == 0 else extra

    def _guard(self, call):
        """Run a provider call; a systemic failure stops the whole job once, with its message."""
        try:
            return call()
        except SystemicError as exc:
            self.control.stop(str(exc), code=exc.code)
            raise

    def _guarded(self, results: Iterator[pa.Table]) -> Iterator[pa.Table]:
        try:
            yield from results
        except SystemicError as exc:
            self.control.stop(str(exc), code=exc.code)
            raise

    def _check_retry_cap(self, shard_id: str, pending: pa.Table, results: pl.DataFrame) -> None:
        """Stop before a resubmission that would take retry spend past its cap. Decided from the per-shard
        summaries (the job's first-try and retry costs) and this shard's own results, not every result row."""
        if results.height == 0 or self.stage == Stage.FALLBACK:  # the fallback's spend is its own allowance
            return
        # pending items that failed before at a cost to their budget: the ones this submission retries (a
        # replayed dead letter is a human's decision to spend again, outside the cap)
        ids = pl.Series(pending.column("request_id").to_pylist())
        replayed = Replays(self.store, self.spec.name).table(shard_id)["request_id"]
        retried = results.filter(
            pl.col("request_id").is_in(ids) & ~pl.col("request_id").is_in(replayed) & spends_budget()
        )
        retry_items = retried["request_id"].n_unique()
        if retry_items == 0:
            return
        latest = self.manifest.latest()
        assert latest is not None  # there are pending items, so there is a manifest
        costs = sum((s.retry_costs for s in self._job_summaries()), RetryCosts())
        spend = costs.spend(latest.unique_requests, retry_items, self.spec.retries.spend_cap_share)
        if spend.exceeded:
            reason = f"retry-spend cap reached before resubmitting shard {shard_id}: {spend.describe()}"
            self.control.stop(reason, code="retry_cap")
            raise SystemicError(
                reason + "; inspect the failures (batch-pipeline status), then raise "
                "retries.spend_cap_share or fix the cause and resume",
                code="retry_cap",
            )
