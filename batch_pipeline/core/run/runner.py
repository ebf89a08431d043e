"""Drive one shard attempt through any executor: intents, re-attachment, validation, flushes.

Resuming is the normal path, not a special case: every call derives what is left from the store.
``submit`` sends only items that are neither valid nor dead-lettered, and never while an earlier
attempt of the shard is still open (it re-attaches to that batch instead, asking the provider by key
when the crash came between "accepted" and "recorded"). ``collect`` waits for the batch to end and
appends validated results; a crash mid-collection just collects the same batch again.
"""

import logging
import time
from datetime import UTC, datetime
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from batch_pipeline.core.run.attempts import Attempt, AttemptLog
from batch_pipeline.core.run.control import JobControl, JobPaused
from batch_pipeline.core.money.cost import Price
from batch_pipeline.core.errors import ErrorClass, SystemicError, TransientError
from batch_pipeline.core.run.faults import crash_point, faults_armed
from batch_pipeline.core.run.executor import (BatchExecutor, BatchHandle, BatchState, BatchStatus, RequestPlan,
                                          ShardWork, StreamExecutor)
from batch_pipeline.core.run.lease import Lease, LeaseHeldError, acquire, default_owner
from batch_pipeline.core.manifest.shards import Manifest
from batch_pipeline.core.state.reconcile import DEAD, VALID, item_states, spends_budget
from batch_pipeline.core.run.results import build_results, read_results, write_results
from batch_pipeline.core.money.retry_cap import RetryCosts
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.state.replay import Replays
from batch_pipeline.core.state.summary import ShardSummaries, ShardSummary
from batch_pipeline.core.store import Store

log = logging.getLogger(__name__)

MAX_TRANSIENT_POLLS = 20
MAX_FETCH_TRIES = 4
STATE_COLUMNS = ["request_id", "attempt", "status", "error_class", "error_code", "error_message"]


@dataclass
class SubmitOutcome:
    shard_id: str
    attempt: int | None
    requests: int
    handle: BatchHandle | None
    reattached: bool = False

    @property
    def nothing_to_do(self) -> bool:
        return self.handle is None


@dataclass
class CollectOutcome:
    shard_id: str
    attempts: list[int] = field(default_factory=list)
    rows: int = 0
    succeeded: int = 0
    final_states: list[str] = field(default_factory=list)


class ShardRunner:
    def __init__(self, spec: JobSpec, store: Store, executor: BatchExecutor | StreamExecutor,
                 price: Price | None, pricing: str = "batch", owner: str | None = None,
                 before_spend: Callable[[str, pa.Table], None] | None = None,
                 extra_items: Callable[[str, int], pa.Table | None] | None = None):
        self.spec, self.store, self.executor, self.price, self.pricing = spec, store, executor, price, pricing
        self.manifest = Manifest(spec.name, store)
        self.plan = RequestPlan.from_spec(spec)
        self.control = JobControl(store, spec.name)
        self.owner = owner or default_owner()
        self._cancel_when: Callable[[], bool] | None = None
        self.before_spend = before_spend  # e.g. the budget guard: raises to refuse a paid call
        self.extra_items = extra_items    # e.g. golden probes: (shard, attempt) -> request_id, user_prompt
        self.summaries = ShardSummaries(spec, store)
        self._summaries_cache: tuple[float, list[ShardSummary]] | None = None

    def _changed(self, shard_id: str) -> ShardSummary:
        """Refresh the shard's summary after every record: the driver decides from it."""
        return self.summaries.refresh(shard_id)

    # -- what is left -----------------------------------------------------------------------------------
    def pending_items(self, shard_id: str) -> pa.Table:
        """Items of the shard that are neither valid nor dead-lettered, with their prompts."""
        items = self.manifest.shard_items(shard_id, ["request_id", "shard_id", "user_prompt"])
        results = read_results(self.store, self.spec.name, shard_id, STATE_COLUMNS)
        if results.height == 0:
            return items.select(["request_id", "user_prompt"])
        frame = pl.from_arrow(items)
        assert isinstance(frame, pl.DataFrame)
        states = item_states(frame, results, self.spec.retries, Replays(self.store, self.spec.name).table(shard_id))
        done = states.filter(pl.col("state").is_in([VALID, DEAD])).select("request_id")
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
            work = self._start_attempt(shard_id, attempts, lease, executor.name, only, canary)
            if work is None:
                return SubmitOutcome(shard_id, None, 0, None)
            handle = self._guard(lambda: executor.submit(work))  # a crash here is repaired by find() next time
            crash_point("after_create")
            attempts.record(work.attempt, "submitted", handle.as_dict())
            self._changed(shard_id)
            log.info("shard %s: attempt %d submitted %d requests as %s", shard_id, work.attempt,
                     work.items.num_rows, handle.batch_id)
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
                if attempt.open and not attempt.submitted:
                    attempts.record(attempt.number, "abandoned", {"reason": "interrupted; flushed results kept"})
                    self._changed(shard_id)
            return None

    def _resolve_open(self, shard_id: str, executor: BatchExecutor, attempts: AttemptLog) -> SubmitOutcome | None:
        """Settle every open attempt before anything new is sent: a submitted one is re-attached; an intent with
        no submission (a crash between the two) is looked up at the provider (``find``) and re-attached when the
        provider has it, else closed once the executor's grace period (``find_grace_s``) has passed."""
        for attempt in attempts.all():
            if not attempt.open:
                continue
            if attempt.submitted:
                log.info("shard %s: attempt %d already submitted as %s; re-attaching", shard_id, attempt.number,
                         attempt.submitted["batch_id"])
                return SubmitOutcome(shard_id, attempt.number, len(attempt.request_ids),
                                     BatchHandle.from_dict(attempt.submitted), reattached=True)
            if attempt.backend not in (None, executor.name):
                attempts.record(attempt.number, "abandoned", {"reason": f"interrupted {attempt.backend} run; "
                                                                        "flushed results kept"})
                self._changed(shard_id)
                continue
            found = self._guard(lambda: executor.find(attempt.key, request_ids=attempt.request_ids,
                                                      not_before=attempt.records["intent"]["at"]))
            if found is not None:
                log.warning("shard %s: attempt %d was accepted by the provider as %s but not recorded; re-attaching",
                            shard_id, attempt.number, found.batch_id)
                attempts.record(attempt.number, "submitted", {**found.as_dict(), "reattached": True})
                self._changed(shard_id)
                return SubmitOutcome(shard_id, attempt.number, len(attempt.request_ids), found, reattached=True)
            age = (datetime.now(UTC) - datetime.fromisoformat(attempt.records["intent"]["at"])).total_seconds()
            grace = float(getattr(executor, "find_grace_s", 0.0))
            if age < grace:
                raise TransientError(f"shard {shard_id}: attempt {attempt.number} has an intent {age:.0f} s old and "
                                     f"the provider shows no batch yet; asking again after {grace:.0f} s",
                                     retry_after_s=grace - age)
            attempts.record(attempt.number, "abandoned", {"reason": "the provider has no batch for this key"})
            self._changed(shard_id)
        return None

    def _start_attempt(self, shard_id: str, attempts: AttemptLog, lease: Lease, backend: str,
                       only: list[str] | None = None, canary: bool = False) -> ShardWork | None:
        """What is left, past the spend checks, claimed under the lease with an intent record; None if nothing is."""
        pending = self.pending_items(shard_id)
        if only is not None:
            pending = pending.filter(pc.is_in(pending.column("request_id"), value_set=pa.array(only, pa.string())))
        number = attempts.next_number()
        extra = self._extra(shard_id, number)
        if pending.num_rows == 0 and (not canary or extra is None):
            return None
        self._check_retry_cap(shard_id, pending)
        if self.before_spend:
            self.before_spend(shard_id, pending)
        if extra is not None:
            pending = pa.concat_tables([pending.select(["request_id", "user_prompt"]),
                                        extra.select(["request_id", "user_prompt"]).cast(pending.schema)])
        work = ShardWork(self.spec.name, shard_id, number, self._key(shard_id, number), self._plan(shard_id), pending)
        lease.check("start an attempt")
        if not attempts.create_intent(number, {"key": work.key, "backend": backend, "lease_token": lease.token,
                                               "request_ids": work.request_ids, "requests": pending.num_rows,
                                               "canary": canary}):
            raise LeaseHeldError(f"shard {shard_id}: attempt {number} was claimed by another run")
        crash_point("after_intent")
        self._changed(shard_id)
        return work

    def _job_summaries(self) -> list[ShardSummary]:
        """Every shard's summary, read at most every 30 s by one runner (a ranged run submits many shards)."""
        now = time.monotonic()
        if self._summaries_cache is None or now - self._summaries_cache[0] > 30:
            self._summaries_cache = (now, self.summaries.all())
        return self._summaries_cache[1]

    def _plan(self, shard_id: str) -> RequestPlan:
        """The job's request plan, with the larger ``max_tokens`` a replay granted this shard (if any)."""
        granted = Replays(self.store, self.spec.name).max_tokens(shard_id)
        if granted is None or granted <= self.plan.sampling.max_tokens:
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

    def _check_retry_cap(self, shard_id: str, pending: pa.Table) -> None:
        """Stop before a resubmission that would take retry spend past its cap. Decided from the per-shard
        summaries (the job's first-try and retry costs) and this shard's own results, not every result row."""
        results = read_results(self.store, self.spec.name, shard_id, columns=STATE_COLUMNS)
        if results.height == 0:
            return
        # pending items that failed before at a cost to their budget: the ones this submission retries (a
        # replayed dead letter is a human's decision to spend again, outside the cap)
        ids = pl.Series(pending.column("request_id").to_pylist())
        replayed = Replays(self.store, self.spec.name).table(shard_id)["request_id"]
        retried = results.filter(pl.col("request_id").is_in(ids) & ~pl.col("request_id").is_in(replayed)
                                 & spends_budget())
        retry_items = retried["request_id"].n_unique()
        if retry_items == 0:
            return
        latest = self.manifest.latest()
        assert latest is not None  # there are pending items, so there is a manifest
        costs = sum((s.retry_costs for s in self._job_summaries()), RetryCosts())
        spend = costs.spend(latest["unique_requests"], retry_items, self.spec.retries.spend_cap_share)
        if spend.exceeded:
            reason = f"retry-spend cap reached before resubmitting shard {shard_id}: {spend.describe()}"
            self.control.stop(reason, code="retry_cap")
            raise SystemicError(reason + "; inspect the failures (batch-pipeline status), then raise "
                                "retries.spend_cap_share or fix the cause and resume", code="retry_cap")

    # -- stream shape ---------------------------------------------------------------------------------------
    def run_stream(self, shard_id: str, on_flush: Callable[[int, int], None] | None = None,
                   only: list[str] | None = None, canary: bool = False) -> CollectOutcome:
        """Run the shard's pending items inline (vLLM, an online endpoint), writing a part per flush.

        An attempt of a stream backend left open by a crash is closed as interrupted: what it flushed is in the
        store, and the new attempt sends only what is still pending. An open provider batch is never closed
        here: the state machine refuses it (rescue cancels and collects it first, so its results are kept).
        """
        executor = self.executor
        assert isinstance(executor, StreamExecutor)
        self.control.ensure_running()
        with acquire(self.store, self.spec.name, shard_id, self.owner) as lease:
            attempts = AttemptLog(self.store, self.spec.name, shard_id)
            for attempt in attempts.all():
                if attempt.open:
                    attempts.record(attempt.number, "abandoned", {"reason": "interrupted; flushed results kept"})
                    self._changed(shard_id)
            outcome = CollectOutcome(shard_id)
            work = self._start_attempt(shard_id, attempts, lease, executor.name, only, canary)
            if work is None:
                return outcome
            number, total = work.attempt, work.items.num_rows
            expected = pa.array(work.request_ids, pa.string())
            renew_at = time.monotonic() + lease.ttl.total_seconds() / 3
            flush = 0

            def store_flush(raw: pa.Table) -> None:
                nonlocal flush
                lease.check("write a result part")  # fenced: a stale attempt writes no part
                flush += 1
                raw = raw.filter(pc.is_in(raw.column("request_id"), value_set=expected))
                table = build_results(raw, work, backend=executor.name, pricing=self.pricing,
                                      prompt_version=self.spec.prompt.version, price=self.price, provider_batch_id=None)
                write_results(self.store, self.spec.name, shard_id, number, flush, table)
                outcome.rows += table.num_rows
                outcome.succeeded += pc.sum(pc.equal(table.column("status"), "succeeded")).as_py() or 0

            in_hand: pa.Table | None = None  # yielded by the engine, not yet stored
            stream = self._guarded(executor.run(work))
            try:
                for raw in stream:
                    in_hand = raw
                    store_flush(raw)
                    in_hand = None
                    crash_point("mid_stream")
                    if self.control.paused():  # a deploy: finish what is in flight, store it, give the shard back
                        raise JobPaused(f"job {self.spec.name} paused: shard {shard_id} stopped after "
                                        f"{outcome.rows} of {total} results")
                    if on_flush:
                        on_flush(outcome.rows, total)
                    if time.monotonic() > renew_at:
                        lease.renew()
                        renew_at = time.monotonic() + lease.ttl.total_seconds() / 3
            except BaseException as exc:
                # interrupted (SIGTERM, a pause, a systemic stop): results the engine already has were paid for,
                # so they are stored before the attempt is left open for the next run to close
                stream.close()  # the engine stops sending and hands over what it holds
                if not lease.is_current():  # fenced: a stale attempt stores and records nothing more
                    raise
                if in_hand is not None:  # interrupted while storing it: store it whole (re-written rows dedupe)
                    store_flush(in_hand)
                unflushed = getattr(executor, "take_unflushed", None)
                leftover = unflushed(work.key) if unflushed else None
                if leftover is not None and leftover.num_rows:
                    store_flush(leftover)
                    log.warning("shard %s: interrupted; %d finished results stored before stopping", shard_id,
                                leftover.num_rows)
                if isinstance(exc, JobPaused):
                    attempts.record(number, "abandoned", {"reason": "paused; flushed results kept",
                                                          "rows": outcome.rows})
                    self._changed(shard_id)
                raise
            lease.check("mark the attempt collected")
            attempts.record(number, "collected", {"state": "completed", "rows": outcome.rows,
                                                  "succeeded": outcome.succeeded})
            self._changed(shard_id)
            outcome.attempts.append(number)
            outcome.final_states.append("completed")
            return outcome

    def open_attempts(self, shard_id: str) -> list[Attempt]:
        return [a for a in AttemptLog(self.store, self.spec.name, shard_id).all() if a.open and a.submitted]

    def poll(self, shard_id: str) -> list[tuple[Attempt, BatchStatus]]:
        executor = self.executor
        assert isinstance(executor, BatchExecutor)
        return [(a, executor.poll(BatchHandle.from_dict(a.submitted or {}))) for a in self.open_attempts(shard_id)]

    def collect(self, shard_id: str, *, poll_interval_s: float = 1.0, timeout_s: float | None = None,
                on_status: Callable[[str, BatchStatus], None] | None = None,
                cancel_when: Callable[[], bool] | None = None) -> CollectOutcome:
        """Wait for every open batch of the shard to end, then ingest its results.

        ``cancel_when`` is asked while waiting; once it says yes the batch is cancelled (its finished
        requests are kept) so that the rest can be rescued elsewhere.
        """
        self._cancel_when = cancel_when
        executor = self.executor
        assert isinstance(executor, BatchExecutor)
        with acquire(self.store, self.spec.name, shard_id, self.owner) as lease:
            return self._collect(shard_id, executor, lease, poll_interval_s, timeout_s, on_status)

    def _collect(self, shard_id: str, executor: BatchExecutor, lease: Lease, poll_interval_s: float,
                 timeout_s: float | None, on_status: Callable[[str, BatchStatus], None] | None) -> CollectOutcome:
        outcome = CollectOutcome(shard_id)
        log_ = AttemptLog(self.store, self.spec.name, shard_id)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        renew_at = time.monotonic() + lease.ttl.total_seconds() / 3
        for attempt in self.open_attempts(shard_id):
            handle = BatchHandle.from_dict(attempt.submitted or {})
            transient_in_a_row = 0
            while True:
                try:
                    status = self._guard(lambda: executor.poll(handle))
                    transient_in_a_row = 0
                except TransientError as exc:  # a flaky poll is not a failed batch: wait and ask again
                    transient_in_a_row += 1
                    if transient_in_a_row > MAX_TRANSIENT_POLLS:
                        raise
                    wait = min(exc.retry_after_s or poll_interval_s * 2 ** transient_in_a_row, 60.0)
                    log.warning("shard %s: polling %s failed (%s); again in %.1fs", shard_id, handle.batch_id, exc, wait)
                    time.sleep(wait)
                    continue
                if time.monotonic() > renew_at:
                    lease.renew()
                    renew_at = time.monotonic() + lease.ttl.total_seconds() / 3
                if on_status:
                    on_status(shard_id, status)
                if status.state.ended:
                    break
                if self.control.paused():  # the batch keeps running at the provider; a later run collects it
                    raise JobPaused(f"job {self.spec.name} paused: batch {handle.batch_id} of shard {shard_id} is "
                                    f"left running ({status.provider_status}); resume collects it")
                if self._cancel_when is not None and status.state != BatchState.CANCELLING and self._cancel_when():
                    log.warning("shard %s: cancelling batch %s to rescue its tail", shard_id, handle.batch_id)
                    self._guard(lambda: executor.cancel(handle))
                    self._cancel_when = None
                if deadline is not None and time.monotonic() > deadline:
                    raise TransientError(f"shard {shard_id}: batch {handle.batch_id} still {status.provider_status}")
                time.sleep(poll_interval_s)
            if status.state == BatchState.FAILED:
                lease.check("record a failed batch")
                log_.record(attempt.number, "collected", {"state": status.state.value, "errors": status.errors})
                self._changed(shard_id)
                reason = (f"shard {shard_id}: batch {handle.batch_id} failed at the provider: "
                          + "; ".join(status.errors[:5]))
                self.control.stop(reason, code="batch_failed")
                raise SystemicError(reason, code="batch_failed")
            rows, ok, systemic = self._ingest_with_retries(attempt, handle, lease)
            crash_point("before_collected")
            lease.check("mark the attempt collected")
            log_.record(attempt.number, "collected", {"state": status.state.value, "rows": rows, "succeeded": ok,
                                                      "systemic": systemic,
                                                      "provider_counts": {"total": status.total,
                                                                          "completed": status.completed,
                                                                          "failed": status.failed}})
            self._changed(shard_id)
            crash_point("after_collected")
            if systemic:  # recorded (no item's budget spent on it), then the job stops once, with one message
                reason = (f"shard {shard_id}: batch {handle.batch_id}: {systemic['count']} request(s) failed with "
                          f"{systemic['code']}: {systemic['message']}")
                self.control.stop(reason, code=systemic["code"])
                raise SystemicError(reason, code=systemic["code"])
            outcome.attempts.append(attempt.number)
            outcome.rows += rows
            outcome.succeeded += ok
            outcome.final_states.append(status.state.value)
        return outcome

    def _ingest_with_retries(self, attempt: Attempt, handle: BatchHandle,
                             lease: Lease | None = None) -> tuple[int, int, dict | None]:
        """A download that breaks half-way is fetched again; rows already written are deduplicated."""
        for n in range(1, MAX_FETCH_TRIES + 1):
            try:
                return self._ingest(attempt, handle, lease)
            except TransientError as exc:
                if n == MAX_FETCH_TRIES:
                    raise
                log.warning("fetching %s failed (%s); trying again", handle.batch_id, exc)
                time.sleep(min(exc.retry_after_s or 2.0 ** n, 60.0))
        raise AssertionError("unreachable")

    def _ingest(self, attempt: Attempt, handle: BatchHandle,
                lease: Lease | None = None) -> tuple[int, int, dict | None]:
        """Validate and append every result of one ended batch; IDs outside the attempt are ignored. Returns the
        rows stored, how many succeeded, and the first systemic error inside the files (bad key, no credit), if any.

        Each part is written on a background thread (Parquet and zstd release the GIL) while the next block is
        fetched and validated; every write has finished when this returns or raises. Under ``lease`` each part is
        fenced (``StaleAttemptError`` once another run took the shard over) and a long download renews the lease.
        """
        from batch_pipeline.core.store import BackgroundWrites

        executor = self.executor
        assert isinstance(executor, BatchExecutor)
        shard_id = attempt.key.split(":")[1]
        work = ShardWork(self.spec.name, shard_id, attempt.number, attempt.key, self.plan,
                         pa.table({"request_id": attempt.request_ids}))
        expected = pa.array(attempt.request_ids, pa.string())
        rows = ok = 0
        systemic: dict | None = None
        answered: list[pa.Array] = []
        started = time.monotonic()
        with BackgroundWrites(depth=2) as writes:
            for flush, raw in enumerate(executor.fetch(handle), start=1):
                mine = raw.filter(pc.is_in(raw.column("request_id"), value_set=expected))
                if mine.num_rows != raw.num_rows:
                    log.warning("shard %s: batch %s returned %d results for IDs not in attempt %d; ignored",
                                shard_id, handle.batch_id, raw.num_rows - mine.num_rows, attempt.number)
                table = build_results(mine, work, backend=executor.name, pricing=self.pricing,
                                      prompt_version=self.spec.prompt.version, price=self.price,
                                      provider_batch_id=handle.batch_id)
                if lease is not None:  # fenced before each part (one lease-dir listing, ~0.1 ms locally)
                    lease.check("write a result part")
                    lease.heartbeat()  # every ttl/3: a huge or slow download outlasts no lease
                writes.submit(write_results, self.store, self.spec.name, shard_id, attempt.number, flush, table)
                if flush == 1 and faults_armed():
                    writes.wait()
                    crash_point("mid_collect")  # a part is written, the next is not
                rows += table.num_rows
                ok += pc.sum(pc.equal(table.column("status"), "succeeded")).as_py() or 0
                answered.extend(table.column("request_id").chunks)
                systemic = _systemic(table, systemic)
        elapsed = time.monotonic() - started
        log.info("shard %s: batch %s: %d results stored (%d succeeded) in %.1f s, %.0f results/s", shard_id,
                 handle.batch_id, rows, ok, elapsed, rows / elapsed if elapsed > 0 else 0.0)
        seen = pa.concat_arrays(answered) if answered else pa.array([], pa.string())
        missing = pc.count_distinct(expected.filter(pc.invert(pc.is_in(expected, value_set=seen)))).as_py()
        if missing:
            log.warning("shard %s: batch %s has no result for %d of %d requests; they stay pending",
                        shard_id, handle.batch_id, missing, len(attempt.request_ids))
        return rows, ok, systemic

    # -- rescue ---------------------------------------------------------------------------------------------
    def rescue(self, shard_id: str, tail: "ShardRunner", *, poll_interval_s: float = 1.0,
               timeout_s: float | None = None) -> tuple[CollectOutcome, CollectOutcome]:
        """Move a shard to the tail backend without paying twice: its live batch is cancelled first, the run
        waits for the provider to end it and ingests what it finished, and only the items that still have no
        result go to ``tail`` (a stream runner). An intent with no recorded submission is looked up first.
        """
        executor = self.executor
        assert isinstance(executor, BatchExecutor)
        self.control.ensure_running()
        with acquire(self.store, self.spec.name, shard_id, self.owner):
            self._resolve_open(shard_id, executor, AttemptLog(self.store, self.spec.name, shard_id))
        collected = CollectOutcome(shard_id)
        if self.open_attempts(shard_id):
            collected = self.collect(shard_id, poll_interval_s=poll_interval_s, timeout_s=timeout_s,
                                     cancel_when=lambda: True)
        crash_point("mid_rescue")
        return collected, tail.run_stream(shard_id)


def _systemic(table: pa.Table, first: dict | None) -> dict | None:
    """Count the systemic failures of a result table (keeping the first code and message seen)."""
    mask = pc.equal(table.column("error_class"), ErrorClass.SYSTEMIC.value)
    n = pc.sum(mask).as_py() or 0
    if not n:
        return first
    if first is None:
        hit = table.filter(mask).slice(0, 1)
        first = {"code": hit.column("error_code")[0].as_py() or "systemic",
                 "message": (hit.column("error_message")[0].as_py() or "")[:300], "count": 0}
    first["count"] += n
    return first
