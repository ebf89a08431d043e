"""Anthropic message batches and their clock-driven lifecycle (advanced lazily, never by a background thread).

in_progress -> ended; in_progress -> canceling -> ended. Requests are processed one by one, linearly over
``in_progress_s`` (after ``validating_s``), in a deterministic shuffled order, and the batch ends
``finalizing_s`` later. At ``expires_at`` (24 h), or at the end of in_progress under the ``expire``
scenario, the unprocessed requests become ``expired``; after a cancel they become ``canceled``.
Only succeeded requests are billed, once, when the batch ends.

A batch's requests are spooled at create (``<batch>.requests``, a JSON line each, read back when run) and its
answers appended to a part as they are produced (``anthropic/answers.py``); when it ends the part becomes its
results file (``<batch>.results.jsonl``), served as it is; in memory the batch keeps its counts only, on disk its
requests as sent too, until it is deleted.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from batch_pipeline.sandbox.anthropic.answers import RESULTS, AnthropicAnswers
from batch_pipeline.sandbox.anthropic.create_body import CreateBody
from batch_pipeline.sandbox.anthropic.errors import anthropic_error, invalid_request
from batch_pipeline.sandbox.anthropic.responder import AnthropicResult, AnthropicRunner
from batch_pipeline.sandbox.batches import lines_due, output_order
from batch_pipeline.sandbox.quotas import DEFAULT_ACCOUNT, Load, LoadBook
from batch_pipeline.sandbox.scenarios import Scenario
from batch_pipeline.sandbox.spooled_lines import SpooledLines
from batch_pipeline.sandbox.spooled_parts import bill_rows
from batch_pipeline.sandbox.spooled_record import SpooledRecord, SpooledStore
from batch_pipeline.sandbox.store import Bill, rfc3339

EXPIRY_S = 24 * 3600
RESULTS_KEPT_S = 29 * 24 * 3600


@dataclass
class AnthropicBatch(SpooledRecord):
    """All the sandbox knows about one message batch. Times are clock seconds."""

    NESTED: ClassVar[dict[str, Any]] = {"results": AnthropicResult}
    PARTS_TYPE = AnthropicAnswers

    id: str
    created_at: float
    requests: list[dict[str, Any]] | SpooledLines  # a list in a state saved before the spool
    order: Any  # the processing order: the requests' ``order`` column (a list in a state saved before the spool)
    scenario: Scenario
    processing_status: str = "in_progress"
    results: list[AnthropicResult] | AnthropicAnswers = field(default_factory=list)
    cancel_initiated_at: float | None = None
    ended_at: float | None = None
    unprocessed: str | None = None  # "canceled" or "expired": what the requests never run became
    account: str = DEFAULT_ACCOUNT  # the key that created it: whose queue its requests wait in
    totals: dict[str, int] | None = None  # once ended: its requests, answers and how many succeeded
    results_file: str | None = None  # once ended: the results file's name in the spool, and its size
    results_size: int = 0
    requests_file: str | None = None  # once ended: the requests as sent, kept in the spool with the results

    @property
    def ended(self) -> bool:
        return self.processing_status == "ended"

    @property
    def expires_at(self) -> float:
        return self.created_at + EXPIRY_S

    @property
    def due_end(self) -> float:
        """When the batch will end as things stand (its natural end, or its cancel's)."""
        if self.cancel_initiated_at is not None:
            return self.cancel_due(self.cancel_initiated_at)
        return self.processing_end + self.duration("finalizing_s")

    def archived_at(self, now: float, kept_s: float = RESULTS_KEPT_S) -> float | None:
        """When the results stopped being available (``kept_s`` after creation: 29 days), if that has passed."""
        at = self.created_at + kept_s
        return at if now >= at else None

    def counts(self) -> dict[str, int]:
        """``request_counts``: everything is ``processing`` until the batch has ended."""
        counts = {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
        tally = self.tally()
        if not self.ended:
            counts["processing"] = tally["requests"]
            return counts
        counts["succeeded"], counts["errored"] = tally["succeeded"], tally["processed"] - tally["succeeded"]
        if self.unprocessed is not None:
            counts[self.unprocessed] += tally["requests"] - tally["processed"]
        return counts

    def write_results(self, spool: Path) -> AnthropicAnswers:
        """The batch ended: its answers' part, with the lines of the requests never run, becomes its results file
        (processed requests in processing order, then the others); the answers, for their billing."""
        answers = self.results
        if not isinstance(answers, AnthropicAnswers):  # an ended batch saved with its answers as a list
            answers = self.rebuild_parts(spool)
            assert isinstance(answers, AnthropicAnswers)
        if self.unprocessed is not None:
            never_run: Iterable[int] = self.order[len(answers) :]
            answers.add_unprocessed((self.requests[index]["custom_id"] for index in never_run), self.unprocessed)
        self.results_file = f"{self.id}.results.jsonl"
        self.results_size = answers.take(RESULTS, spool / self.results_file)
        self.results = answers
        self.keep_requests(spool)
        return answers

    def keep_requests(self, spool: Path) -> None:
        """The requests as sent stay on disk with the results until the batch is deleted (``<batch>.requests``,
        a JSON line each: what a dry run's caller reads back to see what it sent); not in memory nor the state."""
        if self.spooled_requests is None:  # an ended batch saved with its requests as a list
            SpooledLines.write(spool / f"{self.id}.requests", self.requests)
        self.requests_file = f"{self.id}.requests"

    def release(self) -> None:
        """Its spool files go but the requests it keeps once ended."""
        if (requests := self.spooled_requests) is not None and self.requests_file:
            requests.close()
            requests.spans_path.unlink(missing_ok=True)
            self.requests = []
        super().release()

    def finish_loaded(self, spool: Path) -> None:
        """An ended batch saved with its answers as a list (billed then): its results file, and compacted."""
        self.write_results(spool)
        self.compact()

    def to_api(self, now: float, host: str, kept_s: float = RESULTS_KEPT_S) -> dict[str, Any]:
        """The API ``MessageBatch`` object; ``results_url`` is absolute, built from the request's host."""
        ended = self.processing_status == "ended"
        return {
            "id": self.id,
            "type": "message_batch",
            "processing_status": self.processing_status,
            "request_counts": self.counts(),
            "created_at": rfc3339(self.created_at),
            "expires_at": rfc3339(self.expires_at),
            "ended_at": rfc3339(self.ended_at),
            "cancel_initiated_at": rfc3339(self.cancel_initiated_at),
            "archived_at": rfc3339(self.archived_at(now, kept_s)),
            "results_url": f"http://{host}/v1/messages/batches/{self.id}/results" if ended else None,
        }


class AnthropicBatches(SpooledStore[AnthropicBatch]):
    """The message batches of one sandbox (callers hold the state lock)."""

    record_type = AnthropicBatch

    def __init__(self, runner: AnthropicRunner, bill: Bill, spool: Path, load: LoadBook | None = None) -> None:
        super().__init__(load)
        self.runner = runner
        self.bill = bill
        self.spool = spool

    def drop_files(self, batch: AnthropicBatch) -> None:
        """A batch goes: its spool files, its results file and its requests."""
        batch.release()
        for name in (batch.results_file, batch.requests_file):
            if name:
                (self.spool / name).unlink(missing_ok=True)

    def results_path(self, batch: AnthropicBatch) -> Path:
        """Where an ended batch's results file is."""
        assert batch.results_file is not None, "an ended batch has its results file"
        return self.spool / batch.results_file

    def requests_path(self, batch_id: str) -> Path:
        """Where a batch's requests are spooled (written as its create body is checked)."""
        return self.spool / f"{batch_id}.requests"

    def create(
        self, batch_id: str, parsed: CreateBody, scenario: Scenario, now: float, account: str = DEFAULT_ACCOUNT
    ) -> AnthropicBatch:
        """A new batch in ``in_progress`` of the requests spooled from its create body; they wait in
        ``account``'s queue until it ends. Its answers will be spooled too (``AnthropicAnswers``)."""
        lines = parsed.lines
        seed = "\n".join(parsed.custom_ids).encode("utf-8")
        lines.columns["order"] = array("q", output_order(seed, len(lines)))
        batch = AnthropicBatch(
            batch_id,
            now,
            lines,
            lines.column("order"),
            scenario,
            results=AnthropicAnswers(self.spool, batch_id),
            account=account,
        )
        self.add(batch)
        load = {model: Load(0, count, 1) for model, count in parsed.models.items()}
        self.book.hold("anthropic", batch.id, account, load, now)
        return batch

    def next_end(self, account: str) -> float | None:
        """The earliest end due among ``account``'s batches still processing (when its queue next shrinks)."""
        ends = [b.due_end for b in self.records.values() if b.account == account and b.processing_status != "ended"]
        return min(ends, default=None)

    def not_found(self, batch_id: str) -> Exception:
        """404 ``not_found_error`` (unknown or deleted)."""
        return anthropic_error(404, f"No message batch with id {batch_id!r}.")

    def cancel(self, batch: AnthropicBatch, now: float) -> None:
        """Start canceling (requests processed so far are kept); 400 once the batch has ended."""
        self.advance(batch, now)
        if batch.processing_status == "ended":
            raise invalid_request(f"Message batch {batch.id} has already ended and cannot be canceled.")
        if batch.processing_status == "canceling":
            return
        batch.processing_status = "canceling"
        batch.cancel_initiated_at = now

    def delete(self, batch_id: str) -> None:
        """Delete an ended batch; 400 while it is still processing."""
        batch = self.get(batch_id)
        if batch.processing_status != "ended":
            raise invalid_request(
                f"Message batch {batch_id} is {batch.processing_status}; only ended batches can be deleted "
                "(cancel it first)."
            )
        del self.records[batch_id]
        self.drop_files(batch)
        self.book.release("anthropic", batch_id, batch.ended_at or 0.0)

    def advance(self, batch: AnthropicBatch, now: float) -> bool:
        """Apply everything due by ``now``; True if anything changed."""
        before = (batch.processing_status, len(batch.results))
        if batch.processing_status == "in_progress":
            natural_end = batch.processing_end + batch.duration("finalizing_s")
            if now >= batch.expires_at and batch.expires_at < natural_end:
                self._process_until(batch, min(batch.expires_at, batch.processing_end))
                self._close(batch, "expired", batch.expires_at)
            elif now >= batch.processing_end:
                self._process_until(batch, batch.processing_end)
                if batch.scenario.name == "expire":
                    self._close(batch, "expired", batch.processing_end)
                elif now >= natural_end:
                    self._close(batch, None, natural_end)
            else:
                self._process_until(batch, now)
        elif batch.processing_status == "canceling":
            due = batch.cancel_due(batch.cancel_initiated_at)
            if now >= due:
                self._close(batch, "canceled", due)
        return before != (batch.processing_status, len(batch.results))

    def _process_until(self, batch: AnthropicBatch, at: float) -> None:
        """Process the requests due by clock time ``at`` (progress is linear over in_progress)."""
        due = lines_due(batch, batch.processing_start, at)
        while len(batch.results) < due:
            request = batch.requests[batch.order[len(batch.results)]]
            batch.results.append(self.runner.run(batch.id, request, batch.scenario))  # type: ignore[arg-type]
        if isinstance(batch.results, AnthropicAnswers):
            batch.results.flush()  # on disk before the state is saved

    def _close(self, batch: AnthropicBatch, unprocessed: str | None, at: float) -> None:
        """The batch ends: its results file is written, its succeeded requests billed (once), its files dropped."""
        batch.processing_status = "ended"
        batch.ended_at = at
        tally = batch.tally()
        batch.unprocessed = unprocessed if tally["processed"] < tally["requests"] else None
        self.book.release("anthropic", batch.id, at)
        answers = batch.write_results(self.spool)
        bill_rows(self.bill, answers.billing("anthropic", None, at))
        batch.compact()
