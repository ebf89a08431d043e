"""The stream shape of the shard runner: vLLM offline or an online endpoint, run inline, a part per flush.

An interrupted run (SIGTERM, a pause, a systemic stop) stores what the engine already has before it stops; a pause
closes the attempt and gives the shard back.
"""

import logging
import time
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

from batch_pipeline.core.ledger.attempts import AttemptLog
from batch_pipeline.core.ledger.control import JobPaused
from batch_pipeline.core.ledger.executor import ShardWork, StreamExecutor
from batch_pipeline.core.ledger.outcomes import CollectOutcome
from batch_pipeline.core.ledger.result_parts import read_results, write_results
from batch_pipeline.core.run.faults import crash_point
from batch_pipeline.core.run.journal import AnswerJournal, replay
from batch_pipeline.core.run.journal import discard as discard_journal
from batch_pipeline.core.run.lease import acquire
from batch_pipeline.core.run.results import build_results

log = logging.getLogger(__name__)


class StreamShape:
    """Mixed into ShardRunner (which holds spec, store, executor, price, lease owner, control and summaries)."""

    def run_stream(
        self,
        shard_id: str,
        on_flush: Callable[[int, int], None] | None = None,
        only: list[str] | None = None,
        canary: bool = False,
    ) -> CollectOutcome:
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
                    self.settle_interrupted(shard_id, attempts, attempt)
            outcome = CollectOutcome(shard_id)
            started = self._start_attempt(shard_id, attempts, lease, executor.name, only, canary)
            if started is None:
                return outcome
            work = started[0]  # a stream backend has no provider queue: no reservation
            journal = (
                AnswerJournal(self.store, self.spec.name, shard_id, work.attempt)
                if self.pricing != "self_hosted"
                else None
            )  # paid answers are durable before they are counted
            work.journal = journal.append if journal is not None else None
            number, total = work.attempt, work.items.num_rows
            expected = pa.array(work.request_ids, pa.string())
            renew_at = time.monotonic() + lease.ttl.total_seconds() / 3
            flush = 0

            def store_flush(raw: pa.Table) -> None:
                nonlocal flush
                lease.check("write a result part")  # fenced: a stale attempt writes no part
                flush += 1
                raw = raw.filter(pc.is_in(raw.column("request_id"), value_set=expected))
                table = build_results(
                    raw,
                    work,
                    backend=executor.name,
                    pricing=self.pricing,
                    prompt_version=self.spec.prompt.version,
                    price=self.price,
                    provider_batch_id=None,
                )
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
                        raise JobPaused(
                            f"job {self.spec.name} paused: shard {shard_id} stopped after "
                            f"{outcome.rows} of {total} results"
                        )
                    if on_flush:
                        on_flush(outcome.rows, total)
                    if time.monotonic() > renew_at:
                        lease.renew()
                        renew_at = time.monotonic() + lease.ttl.total_seconds() / 3
            except BaseException as exc:
                # interrupted (SIGTERM, a pause, a systemic stop): results the engine already has were paid for,
                # so they are stored before the attempt is left open for the next run to close
                stream.close()  # the engine stops sending and hands over what it holds
                if journal is not None:
                    journal.close()  # kept: the next run replays it before it sends anything
                if not lease.is_current():  # fenced: a stale attempt stores and records nothing more
                    raise
                if in_hand is not None:  # interrupted while storing it: store it whole (re-written rows dedupe)
                    store_flush(in_hand)
                unflushed = getattr(executor, "take_unflushed", None)
                leftover = unflushed(work.key) if unflushed else None
                if leftover is not None and leftover.num_rows:
                    store_flush(leftover)
                    log.warning(
                        "shard %s: interrupted; %d finished results stored before stopping", shard_id, leftover.num_rows
                    )
                if isinstance(exc, JobPaused):
                    attempts.record(
                        number, "abandoned", {"reason": "paused; flushed results kept", "rows": outcome.rows}
                    )
                    if journal is not None:
                        discard_journal(self.store, self.spec.name, shard_id, number)  # every answer is stored
                    self._changed(shard_id)
                raise
            if journal is not None:
                journal.close()
            lease.check("mark the attempt collected")
            attempts.record(
                number, "collected", {"state": "completed", "rows": outcome.rows, "succeeded": outcome.succeeded}
            )
            if journal is not None:
                discard_journal(self.store, self.spec.name, shard_id, number)  # folded into the parts
            self._changed(shard_id)
            outcome.attempts.append(number)
            outcome.final_states.append("completed")
            return outcome

    def settle_interrupted(self, shard_id: str, attempts: AttemptLog, attempt) -> None:
        """Close a stream attempt a crash left open: its journal's answers (paid, maybe never folded) are stored as
        a part first, then the attempt is abandoned with the upper bound of what was in flight at the kill (sent,
        possibly billed, no answer: at most the executor's concurrency), which spend and the budget count."""
        work = ShardWork(
            self.spec.name,
            shard_id,
            attempt.number,
            attempt.key,
            self._plan(shard_id),
            pa.table(
                {
                    "request_id": pa.array(attempt.request_ids, pa.string()),
                    "user_prompt": pa.array([""] * len(attempt.request_ids), pa.string()),
                }
            ),
        )
        replayed = replay(self.store, self.spec.name, shard_id, attempt.number)
        if replayed is not None and replayed.num_rows:
            expected = pa.array(attempt.request_ids, pa.string())
            replayed = replayed.filter(pc.is_in(replayed.column("request_id"), value_set=expected))
            table = build_results(
                replayed,
                work,
                backend=attempt.backend or self.executor.name,
                pricing=self.pricing,
                prompt_version=self.spec.prompt.version,
                price=self.price,
                provider_batch_id=None,
            )
            write_results(self.store, self.spec.name, shard_id, attempt.number, JOURNAL_PART, table)
            log.warning(
                "shard %s: attempt %d was interrupted; %d answers replayed from its journal",
                shard_id,
                attempt.number,
                table.num_rows,
            )
        answered = read_results(self.store, self.spec.name, shard_id, ["request_id", "attempt"])
        mine = answered.filter(answered["attempt"] == attempt.number)["request_id"].n_unique() if answered.height else 0
        unanswered = max(len(attempt.request_ids) - mine, 0)
        concurrency = int(getattr(getattr(self.executor, "settings", None), "concurrency", 0) or 0)
        bound = min(unanswered, concurrency) if concurrency else unanswered
        attempts.record(
            attempt.number,
            "abandoned",
            {
                "reason": "interrupted; flushed and journalled results kept",
                "possibly_billed": bound,
                "possibly_billed_usd": round(self._request_cost_high(shard_id) * bound, 10),
            },
        )
        discard_journal(self.store, self.spec.name, shard_id, attempt.number)
        self._changed(shard_id)

    def _request_cost_high(self, shard_id: str) -> float:
        """One request of the shard at its highest: the mean estimated input, every output token allowed."""
        if self.price is None:
            return 0.0
        est = self.manifest.shard_items(shard_id, ["est_input_tokens"]).column("est_input_tokens")
        mean_in = (pc.mean(est).as_py() or 0.0) if len(est) else 0.0
        return float(self.price.cost(mean_in, self.spec.max_output_tokens, batch=self.pricing == "batch"))


JOURNAL_PART = 9999  # the part number of answers replayed from an interrupted attempt's journal
