"""The batch shape's second half: wait for a provider batch to end, ingest its results, and rescue a shard's
tail (cancel first, keep what finished, send online only what has no result). A crash mid-collection just
collects the same batch again: rows already written are deduplicated.
"""

import logging
import time
from collections.abc import Callable
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batch_pipeline.core.errors import (
    QUOTA_BATCH_CODES,
    ErrorClass,
    QuotaError,
    ResultsGoneError,
    SystemicError,
    TransientError,
)
from batch_pipeline.core.ledger.attempts import Attempt, AttemptLog
from batch_pipeline.core.ledger.capacity import Dimension, stated_limit
from batch_pipeline.core.ledger.control import JobPaused
from batch_pipeline.core.ledger.executor import BatchExecutor, BatchHandle, BatchState, BatchStatus, ShardWork
from batch_pipeline.core.ledger.outcomes import CollectOutcome
from batch_pipeline.core.ledger.result_parts import new_part, write_part, write_payload
from batch_pipeline.core.run.faults import crash_point, faults_armed
from batch_pipeline.core.run.hygiene import discard_collected
from batch_pipeline.core.run.lease import Lease, LeaseKeeper, acquire
from batch_pipeline.core.run.pace import PollPace
from batch_pipeline.core.run.results import build_results
from batch_pipeline.core.run.stream import StreamShape

log = logging.getLogger(__name__)

MAX_TRANSIENT_POLLS = 20
MAX_FETCH_TRIES = 4


class CollectShape:
    """Mixed into ShardRunner (which holds spec, store, executor, price, lease owner, control and summaries)."""

    def open_attempts(self, shard_id: str, request_ids: bool = True) -> list[Attempt]:
        log_ = AttemptLog(self.store, self.spec.name, shard_id)
        return [a for a in log_.all(request_ids=request_ids) if a.open and a.submitted]

    def poll(self, shard_id: str) -> list[tuple[Attempt, BatchStatus]]:
        executor = self.executor
        assert isinstance(executor, BatchExecutor)
        opened = self.open_attempts(shard_id, request_ids=False)
        return [(a, executor.poll(a.submitted.handle())) for a in opened if a.submitted]

    def collect(
        self,
        shard_id: str,
        *,
        poll_interval_s: float = 1.0,
        timeout_s: float | None = None,
        on_status: Callable[[str, BatchStatus], None] | None = None,
        cancel_when: Callable[[], bool] | None = None,
    ) -> CollectOutcome:
        """Wait for every open batch of the shard to end, then ingest its results.

        ``cancel_when`` is asked while waiting; once it says yes the batch is cancelled (its finished
        requests are kept) so that the rest can be rescued elsewhere.
        """
        executor = self.executor
        assert isinstance(executor, BatchExecutor)
        with acquire(self.store, self.spec.name, shard_id, self.owner) as lease:
            return self._collect(shard_id, executor, lease, poll_interval_s, timeout_s, on_status, cancel_when)

    def _collect(
        self,
        shard_id: str,
        executor: BatchExecutor,
        lease: Lease,
        poll_interval_s: float,
        timeout_s: float | None,
        on_status: Callable[[str, BatchStatus], None] | None,
        cancel_when: Callable[[], bool] | None,
    ) -> CollectOutcome:
        """Every open batch of the shard, in turn (the state is in the call, not on the runner: the driver may
        collect several shards with one runner at once)."""
        outcome = CollectOutcome(shard_id)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        keeper = LeaseKeeper(lease)
        for attempt in self.open_attempts(shard_id):
            assert attempt.submitted is not None  # open_attempts: submitted ones only
            handle = attempt.submitted.handle()
            status = self._wait_until_ended(
                shard_id, handle, executor, keeper, poll_interval_s, deadline, on_status, cancel_when
            )
            self._take(shard_id, attempt, handle, status, executor, lease, outcome)
        return outcome

    def _wait_until_ended(
        self,
        shard_id: str,
        handle: BatchHandle,
        executor: BatchExecutor,
        keeper: "LeaseKeeper",
        poll_interval_s: float,
        deadline: float | None,
        on_status: Callable[[str, BatchStatus], None] | None,
        cancel_when: Callable[[], bool] | None,
    ) -> BatchStatus:
        """Poll the batch until the provider ends it (a flaky poll is asked again; a pause or the deadline stops
        the wait, the batch keeps running); cancel it when the tail rescue asks. The waits between polls
        stretch while the batch stays in one state (``pace``)."""
        transient_in_a_row = 0
        pace = PollPace(poll_interval_s)
        while True:
            try:
                status = self._guard(partial(executor.poll, handle))
                transient_in_a_row = 0
            except TransientError as exc:  # a flaky poll is not a failed batch: wait and ask again
                transient_in_a_row += 1
                if transient_in_a_row > MAX_TRANSIENT_POLLS:
                    raise
                wait = min(exc.retry_after_s or poll_interval_s * 2**transient_in_a_row, 60.0)
                log.warning("shard %s: polling %s failed (%s); again in %.1fs", shard_id, handle.batch_id, exc, wait)
                time.sleep(wait)
                continue
            keeper.tick()
            if on_status:
                on_status(shard_id, status)
            if status.state.ended:
                return status
            if self.control.paused():  # the batch keeps running at the provider; a later run collects it
                raise JobPaused(
                    f"job {self.spec.name} paused: batch {handle.batch_id} of shard {shard_id} is "
                    f"left running ({status.provider_status}); resume collects it"
                )
            if cancel_when is not None and status.state != BatchState.CANCELLING and cancel_when():
                log.warning("shard %s: cancelling batch %s to rescue its tail", shard_id, handle.batch_id)
                self._guard(partial(executor.cancel, handle))
                cancel_when = None
            if deadline is not None and time.monotonic() > deadline:
                raise TransientError(f"shard {shard_id}: batch {handle.batch_id} still {status.provider_status}")
            time.sleep(pace.after(status.state))

    def _take(
        self,
        shard_id: str,
        attempt: Attempt,
        handle: BatchHandle,
        status: BatchStatus,
        executor: BatchExecutor,
        lease: Lease,
        outcome: CollectOutcome,
    ) -> None:
        """An ended batch: refused for quota (waits), failed (stops the job), or ingested and recorded."""
        if status.state == BatchState.FAILED and QUOTA_BATCH_CODES & set(status.codes):
            self._refused_batch(shard_id, attempt.number, handle, status, lease)  # nothing billed: it waits
            outcome.attempts.append(attempt.number)
            outcome.final_states.append(status.state.value)
            return
        log_ = AttemptLog(self.store, self.spec.name, shard_id)
        if status.state == BatchState.FAILED:
            lease.check("record a failed batch")
            log_.record(attempt.number, "collected", {"state": status.state.value, "errors": status.errors})
            self.admission.release(shard_id, attempt.number, f"batch {status.provider_status}")
            self._changed(shard_id)
            reason = f"shard {shard_id}: batch {handle.batch_id} failed at the provider: " + "; ".join(
                status.errors[:5]
            )
            self.control.stop(reason, code="batch_failed")
            raise SystemicError(reason, code="batch_failed")
        try:
            rows, ok, systemic = self._ingest_with_retries(attempt, handle, lease)
        except ResultsGoneError as exc:  # billed, then deleted at the provider: a human decides what next
            self._lost(shard_id, attempt.number, handle, status, lease, exc)
            outcome.attempts.append(attempt.number)
            outcome.final_states.append("lost")
            return
        crash_point("before_collected")
        lease.check("mark the attempt collected")
        log_.record(
            attempt.number,
            "collected",
            {
                "state": status.state.value,
                "rows": rows,
                "succeeded": ok,
                "systemic": systemic,
                "provider_counts": {"total": status.total, "completed": status.completed, "failed": status.failed},
            },
        )
        self.admission.release(shard_id, attempt.number, f"batch {status.provider_status}")
        self._changed(shard_id)
        crash_point("after_collected")
        crash_point("before_discard")  # stored, not yet deleted at the provider: the publish run's sweep deletes
        discard_collected(self.store, self.spec.name, shard_id, attempt.number, handle, executor)
        if systemic:  # recorded (no item's budget spent on it), then the job stops once, with one message
            reason = (
                f"shard {shard_id}: batch {handle.batch_id}: {systemic['count']} request(s) failed with "
                f"{systemic['code']}: {systemic['message']}"
            )
            self.control.stop(reason, code=systemic["code"])
            raise SystemicError(reason, code=systemic["code"])
        outcome.attempts.append(attempt.number)
        outcome.rows += rows
        outcome.succeeded += ok
        outcome.final_states.append(status.state.value)

    def _refused_batch(
        self, shard_id: str, number: int, handle: BatchHandle, status: BatchStatus, lease: Lease
    ) -> None:
        """The provider accepted the batch, then refused it for capacity (OpenAI's ``token_limit_exceeded``):
        recorded (nothing billed, no item's budget spent), the limit learned, and the shard sent again later."""
        lease.check("record a refused batch")
        message = "; ".join(status.errors[:3])
        note = self.admission.refused(
            self.admission.held(shard_id, number),
            QuotaError(
                message, dimension=Dimension.TOKENS.value, limit=stated_limit(message), code="token_limit_exceeded"
            ),
            account=handle.account,
        )
        AttemptLog(self.store, self.spec.name, shard_id).record(
            number,
            "collected",
            {
                "state": status.state.value,
                "errors": status.errors,
                "rows": 0,
                "succeeded": 0,
                "refused": {"dimension": Dimension.TOKENS.value, "code": "token_limit_exceeded", "note": note},
            },
        )
        self._changed(shard_id)
        log.warning(
            "shard %s: batch %s refused for capacity (%s); the shard waits for room and is sent again",
            shard_id,
            handle.batch_id,
            note,
        )

    def _lost(
        self, shard_id: str, number: int, handle: BatchHandle, status: BatchStatus, lease: Lease, exc: ResultsGoneError
    ) -> None:
        """The batch's results are gone (the provider's retention passed before they were collected): the attempt
        is closed with what it stored, and the shard is held for a human: its missing items were billed, so sending
        them again pays twice, and only `resume` does that."""
        lease.check("record a lost batch")
        AttemptLog(self.store, self.spec.name, shard_id).record(
            number,
            "collected",
            {"state": "lost", "provider_state": status.state.value, "rows": 0, "succeeded": 0, "lost": str(exc)},
        )
        self.admission.release(shard_id, number, "results gone at the provider")
        reason = (
            f"batch {handle.batch_id} of attempt {number} ended, but its results were deleted by the provider "
            f"before they were collected ({exc}); its items were billed once. `batch-pipeline resume "
            f"{self.spec.name}` sends them again (paid again); the other shards go on"
        )
        self.control.hold_shard(shard_id, reason)
        self._changed(shard_id)
        log.error("shard %s: %s", shard_id, reason)

    def _ingest_with_retries(
        self, attempt: Attempt, handle: BatchHandle, lease: Lease | None = None
    ) -> tuple[int, int, dict | None]:
        """A download that breaks half-way is fetched again; rows already written are deduplicated."""
        for n in range(1, MAX_FETCH_TRIES + 1):
            try:
                return self._ingest(attempt, handle, lease)
            except TransientError as exc:
                if n == MAX_FETCH_TRIES:
                    raise
                log.warning("fetching %s failed (%s); trying again", handle.batch_id, exc)
                time.sleep(min(exc.retry_after_s or 2.0**n, 60.0))
        raise AssertionError("unreachable")

    def _ingest(
        self, attempt: Attempt, handle: BatchHandle, lease: Lease | None = None
    ) -> tuple[int, int, dict | None]:
        """Validate and append every result of one ended batch; IDs outside the attempt are ignored. Returns the
        rows stored, how many succeeded, and the first systemic error inside the files (bad key, no credit), if any.

        Per block, the payload part is queued the moment the block is parsed, so it is written on one background
        thread while this one validates the block and the result part is encoded on another (Parquet, zstd and
        LZ4 release the GIL); the result part becomes visible after its payload. The writer threads are long-lived
        (``shared_writers``: an ingest is often one 5,000-line shard). Every write has finished when this returns
        or raises. Under ``lease`` each block is fenced (``StaleAttemptError`` once another run took the shard
        over) and a long download renews the lease.
        """
        from batch_pipeline.core.store import BackgroundWrites

        executor = self.executor
        assert isinstance(executor, BatchExecutor)
        shard_id = attempt.key.split(":")[1]
        expected = pa.array(attempt.request_ids, pa.string())
        work = ShardWork(
            self.spec.name, shard_id, attempt.number, attempt.key, self.plan, pa.table({"request_id": expected})
        )
        rows = ok = 0
        systemic: dict | None = None
        answered: list[np.ndarray] = []  # the position in ``expected`` of every stored row
        started = time.monotonic()
        with BackgroundWrites(depth=4, workers=2, shared=True) as writes:
            for flush, raw in enumerate(executor.fetch(handle), start=1):
                where = pc.index_in(raw.column("request_id"), value_set=expected)  # null: not the attempt's
                mine = raw if where.null_count == 0 else raw.filter(pc.is_valid(where))
                if mine.num_rows != raw.num_rows:
                    log.warning(
                        "shard %s: batch %s returned %d results for IDs not in attempt %d; ignored",
                        shard_id,
                        handle.batch_id,
                        raw.num_rows - mine.num_rows,
                        attempt.number,
                    )
                if lease is not None:  # fenced before each block (one lease-dir listing, ~0.1 ms locally)
                    lease.check("write a result part")
                    lease.heartbeat()  # every ttl/3: a huge or slow download outlasts no lease
                rel = new_part(self.spec.name, shard_id, attempt.number, flush)
                payload = writes.submit(write_payload, self.store, self.spec.name, rel, attempt.number, mine)
                table = build_results(
                    mine,
                    work,
                    backend=executor.name,
                    pricing=self.pricing,
                    prompt_version=self.spec.prompt.version,
                    price=self.price,
                    provider_batch_id=handle.batch_id,
                )
                writes.submit(write_part, self.store, rel, table, payload)
                if flush == 1 and faults_armed():
                    writes.wait()
                    crash_point("mid_collect")  # a part is written, the next is not
                rows += table.num_rows
                ok += pc.sum(pc.equal(table.column("status"), "succeeded")).as_py() or 0
                answered.append(where.drop_null().to_numpy())
                systemic = _systemic(table, systemic)
        elapsed = time.monotonic() - started
        log.info(
            "shard %s: batch %s: %d results stored (%d succeeded) in %.1f s, %.0f results/s",
            shard_id,
            handle.batch_id,
            rows,
            ok,
            elapsed,
            rows / elapsed if elapsed > 0 else 0.0,
        )
        missing = _unanswered(expected, answered)
        if missing:
            log.warning(
                "shard %s: batch %s has no result for %d of %d requests; they stay pending",
                shard_id,
                handle.batch_id,
                missing,
                len(attempt.request_ids),
            )
        return rows, ok, systemic

    # -- rescue ---------------------------------------------------------------------------------------------
    def rescue(
        self, shard_id: str, tail: "StreamShape", *, poll_interval_s: float = 1.0, timeout_s: float | None = None
    ) -> tuple[CollectOutcome, CollectOutcome]:
        """Move a shard to the tail backend without paying twice: its live batch is cancelled first, the run
        waits for the provider to end it and ingests what it finished, and only the items that still have no
        result go to ``tail`` (a stream runner). An intent with no recorded submission is looked up first.
        """
        executor = self.executor
        assert isinstance(executor, BatchExecutor)
        self.control.ensure_running()
        with acquire(self.store, self.spec.name, shard_id, self.owner):
            attempts = AttemptLog(self.store, self.spec.name, shard_id)
            for attempt in attempts.all():  # an online tail killed mid-way: its journalled answers are kept
                if attempt.open and not attempt.submitted and attempt.backend == tail.executor.name:
                    tail.settle_interrupted(shard_id, attempts, attempt)
            self._resolve_open(shard_id, executor, attempts)
        collected = CollectOutcome(shard_id)
        if self.open_attempts(shard_id, request_ids=False):
            collected = self.collect(
                shard_id, poll_interval_s=poll_interval_s, timeout_s=timeout_s, cancel_when=lambda: True
            )
        crash_point("mid_rescue")
        return collected, tail.run_stream(shard_id)


def _unanswered(expected: pa.Array, answered: list[np.ndarray]) -> int:
    """The distinct IDs of ``expected`` without a stored row, from the stored rows' positions in it (``index_in``
    gives a repeated ID its first position): no hashing when every position was hit (two distinct counts over the
    IDs cost ~1 ms a 5,000-line shard); else the positions missed that hold an ID's first occurrence."""
    hit = np.zeros(len(expected), bool)
    for positions in answered:
        hit[positions] = True
    missed = np.flatnonzero(~hit)
    if not len(missed):
        return 0
    first = pc.index_in(expected, value_set=expected).to_numpy(zero_copy_only=False)
    valid = pc.is_valid(expected).to_numpy(zero_copy_only=False)
    return int(((first[missed] == missed) & valid[missed]).sum())


def _systemic(table: pa.Table, first: dict | None) -> dict | None:
    """Count the systemic failures of a result table (keeping the first code and message seen)."""
    mask = pc.equal(table.column("error_class"), ErrorClass.SYSTEMIC.value)
    n = pc.sum(mask).as_py() or 0
    if not n:
        return first
    if first is None:
        hit = table.filter(mask).slice(0, 1)
        first = {
            "code": hit.column("error_code")[0].as_py() or "systemic",
            "message": (hit.column("error_message")[0].as_py() or "")[:300],
            "count": 0,
        }
    first["count"] += n
    return first
