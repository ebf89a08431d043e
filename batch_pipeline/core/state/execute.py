"""Carry out the driver's step for one shard with the runners (the shard assets call this; nothing here decides).

``submit_phase`` asks ``shard_step`` what the shard needs and does it: the canary sample, a new attempt, a
resolve of an orphaned intent, or a rescue that cancels the live batch first. ``collect_phase`` ingests ended
batches, judges the canary, and moves an expired batch's leftovers to the tail backend.
"""

import logging
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import polars as pl

from batch_pipeline.core.errors import BatchPipelineError, SystemicError
from batch_pipeline.core.ledger.control import JobPaused
from batch_pipeline.core.ledger.executor import BatchStatus, StreamExecutor
from batch_pipeline.core.ledger.fallback import Stage
from batch_pipeline.core.ledger.outcomes import CollectOutcome, SubmitOutcome
from batch_pipeline.core.ledger.result_parts import read_results
from batch_pipeline.core.manifest.shards import Manifest
from batch_pipeline.core.quality.golden import canary_sample, judge_canary
from batch_pipeline.core.run.admission import QuotaWait
from batch_pipeline.core.run.rescue import deadline_near, rescue_reason
from batch_pipeline.core.run.runner import ShardRunner
from batch_pipeline.core.run.summary import shard_item_states
from batch_pipeline.core.run.threads import ordered_map
from batch_pipeline.core.settings import COLLECT_SHARDS_AT_ONCE
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.state.driver import Action, Step, Wait, WaitKind, shard_step
from batch_pipeline.core.state.view import load_shard
from batch_pipeline.core.store import Store

log = logging.getLogger(__name__)


class ShardWaits(BatchPipelineError):
    """The driver says this shard cannot move now (e.g. it waits for the canary); the message says why."""


@dataclass
class ShardReport:
    shard_id: str
    action: str
    sent: int = 0
    results: int = 0
    succeeded: int = 0
    rescued: int = 0
    collected: int = 0  # provider batches (attempts) collected
    batches: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def streamed(self, out: CollectOutcome) -> "ShardReport":
        """An inline run of the shard: every request it sent has its result."""
        self.sent = self.results = out.rows
        self.succeeded = out.succeeded
        return self

    def submitted(self, sub: SubmitOutcome) -> "ShardReport":
        """A batch submission: what it sent (nothing when it re-attached), a capacity refusal, the batch made."""
        self.sent = sub.requests if not sub.reattached else 0
        if sub.refused:
            self.action = "wait"
            self.notes.append(f"refused for capacity (nothing billed): {sub.refused}")
        if sub.handle:
            self.batches.append(f"{self.shard_id}:{sub.handle.batch_id}{' (re-attached)' if sub.reattached else ''}")
        return self


class ShardDriver:
    def __init__(
        self,
        spec: JobSpec,
        store: Store,
        runner: ShardRunner | None,
        tail: Callable[[], ShardRunner] | None = None,
        say: Callable[[str], None] | None = None,
        fallback: Callable[[], ShardRunner] | None = None,
        router: Callable[[str], ShardRunner] | None = None,
        fallback_tail: Callable[[], ShardRunner] | None = None,
        fallback_min_batch: int = 0,
    ):
        """``router`` (``backend: auto``): the runner of a shard's routed backend, asked per shard (``runner`` is
        then None until the first shard is taken up). ``fallback_tail``: the fallback model on the tail backend,
        for the fallback's items below its backend's minimum per batch (``fallback_min_batch``)."""
        self.spec, self.store, self.tail, self.fallback, self.router = spec, store, tail, fallback, router
        self.fallback_tail, self.fallback_min_batch = fallback_tail, fallback_min_batch
        self._fallback_runner: ShardRunner | None = None
        self._routed: dict[str, ShardRunner] = {}
        self.say = say or log.info
        self._use(runner)

    def _use(self, runner: ShardRunner | None) -> None:
        self.runner = runner  # type: ignore[assignment]
        executor = runner.executor if runner is not None else None
        self.stream = isinstance(executor, StreamExecutor)
        # the backend's minimum requests per batch (Bedrock's records per job): the driver keeps smaller sends off it
        self.min_batch = int(getattr(executor, "min_requests_per_batch", 0) or 0)

    def _take(self, shard_id: str) -> None:
        """With a router, the shard's own runner (its routed backend and model) for what follows."""
        if self.router is not None:
            self._use(self._primary(shard_id))

    def _primary(self, shard_id: str) -> ShardRunner:
        """The shard's primary runner: its routed one with a router (one per backend and model), else ours."""
        if self.router is None:
            return self.runner
        label = self.router.__name__
        runner = self.router(shard_id)
        return self._routed.setdefault(f"{label}:{runner.executor.name}:{runner.spec.model}", runner)

    def _step(self, shard_id: str) -> Step | Wait | None:
        summary, facts = load_shard(self.spec, self.store, shard_id, self.min_batch, self.fallback_min_batch)
        return shard_step(summary, facts)

    def _tail(self) -> ShardRunner:
        if self.tail is None:
            raise ShardWaits(f"job {self.spec.name} has no tail backend (tail: in the job spec)")
        return self.tail()

    def _fallback(self) -> ShardRunner:
        if self.fallback is None:
            raise ShardWaits(f"job {self.spec.name} has no fallback model (fallback: in the job spec)")
        if self._fallback_runner is None:
            self._fallback_runner = self.fallback()
        return self._fallback_runner

    def _collector(self, shard_id: str, primary: ShardRunner | None = None) -> ShardRunner:
        """The runner whose executor and model own the shard's open attempt (the fallback's, or the primary)."""
        primary = primary or self.runner
        summary = primary.summaries.read(shard_id)
        if summary is not None and summary.open is not None and summary.open.stage == Stage.FALLBACK.value:
            return self._fallback()
        if (
            summary is not None
            and summary.open is not None
            and self.tail is not None
            and summary.open.backend not in (None, primary.executor.name)
        ):
            tail = self._tail()  # an online tail left open by a kill: its own runner replays its journal
            if summary.open.backend == tail.executor.name:
                return tail
        return primary

    def submit_phase(self, shard_id: str) -> ShardReport:
        try:
            return self._submit_phase(shard_id)
        except JobPaused as exc:
            return ShardReport(shard_id, "paused", notes=[str(exc)])
        except QuotaWait as exc:  # the account's queue has no room for it now: it waits, nothing was sent
            return ShardReport(shard_id, "wait", notes=[str(exc)])

    def _submit_phase(self, shard_id: str) -> ShardReport:
        self._take(shard_id)
        self.runner.control.ensure_running()
        step = self._step(shard_id)
        if step is None:
            return ShardReport(shard_id, "settled")
        if isinstance(step, Wait):
            if step.kind in (WaitKind.BATCH_OPEN, WaitKind.IN_FLIGHT, WaitKind.QUOTA):  # not a failure: it waits
                return ShardReport(shard_id, "wait", notes=[step.reason])
            raise ShardWaits(
                f"shard {shard_id} {step.reason}"
                if step.kind in (WaitKind.CANARY, WaitKind.QUOTE)
                else f"shard {shard_id}: {step.reason}"
            )
        report = ShardReport(shard_id, step.action.value)
        if step.action == Action.COLLECT:
            return report  # the collect phase does it
        if step.action == Action.RESOLVE:  # settle the orphan only; the next plan says what to send
            found = self._collector(shard_id).resolve(shard_id)
            if found is not None and found.handle is not None:
                report.batches.append(f"{shard_id}:{found.handle.batch_id} (re-attached)")
            report.notes.append("re-attached to the provider's batch" if found else "intent closed: nothing was sent")
            return report
        if step.action == Action.RESCUE and not self.stream:
            collected, online = self.runner.rescue(shard_id, self._tail(), poll_interval_s=self._poll_interval())
            report.results, report.succeeded = collected.rows + online.rows, collected.succeeded + online.succeeded
            report.rescued = online.rows
            self.say(
                f"shard {shard_id}: {step.reason}: {collected.rows} batch results kept, "
                f"{online.rows} items sent to the tail backend"
            )
            return report
        if step.fallback:
            if step.tail:  # below the fallback backend's minimum: the fallback model on the tail backend
                if self.fallback_tail is None:
                    raise ShardWaits(f"job {self.spec.name} has no tail backend for the fallback model")
                return self._send(self.fallback_tail(), shard_id, report)
            return self._send(self._fallback(), shard_id, report)
        only = self._canary_ids(shard_id) if step.action == Action.CANARY else None
        canary = step.action == Action.CANARY
        # near the deadline (or below the batch minimum) the canary still goes first, on the tail backend
        late = canary and self.tail is not None and (step.tail or deadline_near(self.spec))
        if self.stream or late:
            out = (self._tail() if late else self.runner).run_stream(shard_id, only=only, canary=canary)
            report.streamed(out)
            if canary:
                self.judge(shard_id, nothing_left=out.rows == 0)
            return report
        sub = self.runner.submit(shard_id, only=only, canary=canary)
        report.submitted(sub)
        if canary and not sub.handle:
            self.judge(shard_id, nothing_left=True)
        return report

    def _send(self, runner: ShardRunner, shard_id: str, report: ShardReport) -> ShardReport:
        """The shard's pending items of ``runner``'s stage: inline on a stream backend, else one batch."""
        if isinstance(runner.executor, StreamExecutor):
            return report.streamed(runner.run_stream(shard_id))
        return report.submitted(runner.submit(shard_id))

    def collect_phase(self, shard_id: str, on_status: Callable[[str, BatchStatus], None] | None = None) -> ShardReport:
        got = self._collect_batches(shard_id, on_status)
        return got if isinstance(got, ShardReport) else self._after_collect(shard_id, got)

    def collect_phases(
        self,
        shard_ids: list[str],
        on_status: Callable[[str, BatchStatus], None] | None = None,
        at_once: int = COLLECT_SHARDS_AT_ONCE,
    ) -> Iterator[tuple[str, ShardReport | SystemicError]]:
        """``collect_phase`` of each shard, in order, with up to ``at_once`` shards' batches waited for and
        ingested at the same time: one shard's download and parse overlap another's validation and part writes
        (a 5,000-line shard is one block, so alone it keeps one core busy), and a batch still running does not
        hold up an ended one behind it. What follows a collection (the canary's verdict, a tail rescue, which
        spends money under the budget guard) runs here, one shard at a time, in order. A shard's systemic stop
        is handed back in its place; the shards beside it are still collected."""

        def batches(shard_id: str) -> CollectOutcome | ShardReport | SystemicError:
            try:
                return self._collect_batches(shard_id, on_status)
            except SystemicError as exc:
                return exc

        with ThreadPoolExecutor(max(1, at_once), thread_name_prefix="collect") as pool:
            collected = ordered_map(batches, shard_ids, at_once, ahead=at_once, pool=pool)
            for shard_id, got in zip(shard_ids, collected, strict=True):
                if isinstance(got, CollectOutcome):
                    try:
                        got = self._after_collect(shard_id, got)
                    except SystemicError as exc:
                        got = exc
                yield shard_id, got

    def _collect_batches(
        self, shard_id: str, on_status: Callable[[str, BatchStatus], None] | None
    ) -> CollectOutcome | ShardReport:
        """Wait for the shard's open batches and ingest them (a report instead: nothing to collect, or paused).
        Safe on several shards at once: every step is under the shard's own lease, and the runner keeps no
        per-call state."""
        runner = self._collector(shard_id, self._primary(shard_id))  # the driver's own runner is not switched
        if isinstance(runner.executor, StreamExecutor):
            return ShardReport(shard_id, "collect")
        try:  # at the collecting backend's own pace (a stream primary's fallback batch, say)
            return runner.collect(
                shard_id,
                poll_interval_s=float(getattr(runner.executor, "poll_interval_s", 2.0)),
                on_status=on_status,
                cancel_when=lambda: deadline_near(self.spec),
            )
        except JobPaused as exc:
            return ShardReport(shard_id, "paused", notes=[str(exc)])

    def _after_collect(self, shard_id: str, out: CollectOutcome) -> ShardReport:
        """The canary's verdict once its batch is in, and the tail rescue of an expired batch's leftovers."""
        self._take(shard_id)
        report = ShardReport(shard_id, "collect")
        report.results, report.succeeded, report.collected = out.rows, out.succeeded, len(out.attempts)
        summary = self.runner.summaries.read(shard_id)
        if summary is not None and summary.canary_done:
            self.judge(shard_id)
        reason = rescue_reason(self.spec, out.final_states)
        if reason:
            tail = self._tail().run_stream(shard_id)
            report.rescued = tail.rows
            self.say(f"shard {shard_id}: {reason}; rescued {tail.rows} items online ({tail.succeeded} succeeded)")
        return report

    def judge(self, shard_id: str, nothing_left: bool = False) -> None:
        """Judge the canary once its attempt is in; a failure stops the job (SystemicError, one message)."""
        summary, facts = load_shard(self.spec, self.store, shard_id)
        if not facts.canary.pending or facts.canary.shard_id != shard_id:
            return
        final = nothing_left or summary.attempts >= self.spec.retries.per_item
        results = read_results(self.store, self.spec.name, shard_id)
        states = shard_item_states(self.spec, self.store, shard_id, results)
        verdict = judge_canary(self.spec, self.store, shard_id, results, states, final=final)
        if verdict is None:
            self.say(f"canary {shard_id}: nothing answered yet; it runs again")
            return
        self.say(
            f"canary {shard_id}: {verdict.reason} ({verdict.items} items, structural failure rate "
            f"{verdict.failure_rate:.3f}"
            + (f", accuracy {verdict.accuracy:.3f} on {verdict.probes} probes)" if self.spec.quality else ")")
        )
        if not verdict.passed:
            raise SystemicError(
                f"canary shard {shard_id} failed: {verdict.reason}; the job is stopped before "
                "anything else is sent -- fix the spec, then `batch-pipeline resume`",
                code="canary_failed",
            )

    def _canary_ids(self, shard_id: str) -> list[str]:
        items = pl.from_arrow(
            Manifest(self.spec.name, self.store).shard_items(shard_id, ["request_id", "est_input_tokens"])
        )
        assert isinstance(items, pl.DataFrame)
        return canary_sample(items, self.spec.canary.size)

    def _poll_interval(self) -> float:
        return float(getattr(self.runner.executor, "poll_interval_s", 2.0))
