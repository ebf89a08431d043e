"""The stream shape of the shard runner: vLLM offline or an online endpoint, run inline, a part per flush.

An interrupted run (SIGTERM, a pause, a systemic stop) stores what the engine already has before it stops; a pause
closes the attempt and gives the shard back.
"""

import logging
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
from batch_pipeline.core.run.lease import Lease, LeaseKeeper, acquire
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
            started = self._start_attempt(shard_id, attempts, lease, executor.name, only, canary)
            if started is None:
                return CollectOutcome(shard_id)
            run = _AttemptRun(self, shard_id, started[0], lease, attempts)  # a stream backend has no reservation
            stream = self._guarded(executor.run(run.work))
            try:
                for raw in stream:
                    run.take(raw)
                    crash_point("mid_stream")
                    if self.control.paused():  # a deploy: finish what is in flight, store it, give the shard back
                        raise JobPaused(
                            f"job {self.spec.name} paused: shard {shard_id} stopped after "
                            f"{run.outcome.rows} of {run.total} results"
                        )
                    if on_flush:
                        on_flush(run.outcome.rows, run.total)
                    run.keeper.tick()
            except BaseException as exc:
                stream.close()  # the engine stops sending and hands over what it holds
                run.interrupted(exc)
                raise
            return run.completed()

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


class _AttemptRun:
    """One stream attempt while it runs: each flush stored as a result part (fenced by the lease), its paid
    answers journalled first, and what an interruption leaves in hand stored before the attempt is left open."""

    def __init__(self, runner: "StreamShape", shard_id: str, work, lease: Lease, attempts: AttemptLog):
        self.runner, self.shard_id, self.work, self.lease, self.attempts = runner, shard_id, work, lease, attempts
        self.store, self.job = runner.store, runner.spec.name
        self.journal = (
            AnswerJournal(self.store, self.job, shard_id, work.attempt) if runner.pricing != "self_hosted" else None
        )  # paid answers are durable before they are counted
        work.journal = self.journal.append if self.journal is not None else None
        self.number, self.total = work.attempt, work.items.num_rows
        self.expected = pa.array(work.request_ids, pa.string())
        self.outcome = CollectOutcome(shard_id)
        self.keeper = LeaseKeeper(lease)
        self.flush = 0
        self.in_hand: pa.Table | None = None  # yielded by the engine, not yet stored

    def take(self, raw: pa.Table) -> None:
        self.in_hand = raw
        self.store_flush(raw)
        self.in_hand = None

    def store_flush(self, raw: pa.Table) -> None:
        runner = self.runner
        self.lease.check("write a result part")  # fenced: a stale attempt writes no part
        self.flush += 1
        raw = raw.filter(pc.is_in(raw.column("request_id"), value_set=self.expected))
        table = build_results(
            raw,
            self.work,
            backend=runner.executor.name,
            pricing=runner.pricing,
            prompt_version=runner.spec.prompt.version,
            price=runner.price,
            provider_batch_id=None,
        )
        write_results(self.store, self.job, self.shard_id, self.number, self.flush, table)
        self.outcome.rows += table.num_rows
        self.outcome.succeeded += pc.sum(pc.equal(table.column("status"), "succeeded")).as_py() or 0

    def interrupted(self, exc: BaseException) -> None:
        """Interrupted (SIGTERM, a pause, a systemic stop): results the engine already has were paid for, so they
        are stored before the attempt is left open for the next run to close."""
        if self.journal is not None:
            self.journal.close()  # kept: the next run replays it before it sends anything
        if not self.lease.is_current():  # fenced: a stale attempt stores and records nothing more
            return
        if self.in_hand is not None:  # interrupted while storing it: store it whole (re-written rows dedupe)
            self.store_flush(self.in_hand)
        unflushed = getattr(self.runner.executor, "take_unflushed", None)
        leftover = unflushed(self.work.key) if unflushed else None
        if leftover is not None and leftover.num_rows:
            self.store_flush(leftover)
            log.warning(
                "shard %s: interrupted; %d finished results stored before stopping", self.shard_id, leftover.num_rows
            )
        if isinstance(exc, JobPaused):
            self.attempts.record(
                self.number, "abandoned", {"reason": "paused; flushed results kept", "rows": self.outcome.rows}
            )
            if self.journal is not None:
                discard_journal(self.store, self.job, self.shard_id, self.number)  # every answer is stored
            self.runner._changed(self.shard_id)

    def completed(self) -> CollectOutcome:
        if self.journal is not None:
            self.journal.close()
        self.lease.check("mark the attempt collected")
        self.attempts.record(
            self.number,
            "collected",
            {"state": "completed", "rows": self.outcome.rows, "succeeded": self.outcome.succeeded},
        )
        if self.journal is not None:
            discard_journal(self.store, self.job, self.shard_id, self.number)  # folded into the parts
        self.runner._changed(self.shard_id)
        self.outcome.attempts.append(self.number)
        self.outcome.final_states.append("completed")
        return self.outcome
