"""Anthropic message batches and their clock-driven lifecycle (advanced lazily, never by a background thread).

in_progress -> ended; in_progress -> canceling -> ended. Requests are processed one by one, linearly over
``in_progress_s`` (after ``validating_s``), in a deterministic shuffled order, and the batch ends
``finalizing_s`` later. At ``expires_at`` (24 h), or at the end of in_progress under the ``expire``
scenario, the unprocessed requests become ``expired``; after a cancel they become ``canceled``.
Only succeeded requests are billed, once, when the batch ends.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from batch_pipeline.sandbox.anthropic.errors import anthropic_error, invalid_request
from batch_pipeline.sandbox.anthropic.responder import AnthropicResult, AnthropicRunner
from batch_pipeline.sandbox.batches import lines_due, output_order
from batch_pipeline.sandbox.ids import new_id
from batch_pipeline.sandbox.quotas import DEFAULT_ACCOUNT, Load, LoadBook
from batch_pipeline.sandbox.scenarios import Scenario
from batch_pipeline.sandbox.store import Bill, ProcessedRecord, RecordStore, rfc3339

EXPIRY_S = 24 * 3600
RESULTS_KEPT_S = 29 * 24 * 3600


@dataclass
class AnthropicBatch(ProcessedRecord):
    """All the sandbox knows about one message batch. Times are clock seconds."""

    NESTED: ClassVar[dict[str, Any]] = {"results": AnthropicResult}

    id: str
    created_at: float
    requests: list[dict[str, Any]]
    order: list[int]
    scenario: Scenario
    processing_status: str = "in_progress"
    results: list[AnthropicResult] = field(default_factory=list)
    cancel_initiated_at: float | None = None
    ended_at: float | None = None
    unprocessed: str | None = None  # "canceled" or "expired": what the requests never run became
    account: str = DEFAULT_ACCOUNT  # the key that created it: whose queue its requests wait in

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
        if self.processing_status != "ended":
            counts["processing"] = len(self.requests)
            return counts
        for result in self.results:
            counts["succeeded" if result.succeeded else "errored"] += 1
        if self.unprocessed is not None:
            counts[self.unprocessed] += len(self.requests) - len(self.results)
        return counts

    def result_lines(self) -> list[dict[str, Any]]:
        """The results file: processed requests in processing order, then the ones never run."""
        lines = [{"custom_id": r.custom_id, "result": r.result} for r in self.results]
        if self.unprocessed is not None:
            for index in self.order[len(self.results) :]:
                lines.append({"custom_id": self.requests[index]["custom_id"], "result": {"type": self.unprocessed}})
        return lines

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


class AnthropicBatches(RecordStore[AnthropicBatch]):
    """The message batches of one sandbox (callers hold the state lock)."""

    record_type = AnthropicBatch

    def __init__(self, runner: AnthropicRunner, bill: Bill, load: LoadBook | None = None) -> None:
        super().__init__(load)
        self.runner = runner
        self.bill = bill

    def create(
        self, requests: list[dict[str, Any]], scenario: Scenario, now: float, account: str = DEFAULT_ACCOUNT
    ) -> AnthropicBatch:
        """A new batch in ``in_progress``; its requests wait in ``account``'s queue until it ends."""
        batch = AnthropicBatch(
            new_id("msgbatch_"),
            now,
            requests,
            output_order("\n".join(r["custom_id"] for r in requests).encode("utf-8"), len(requests)),
            scenario,
            account=account,
        )
        self.add(batch)
        per_model: dict[str, int] = {}
        for request in requests:
            model = str(request["params"]["model"])
            per_model[model] = per_model.get(model, 0) + 1
        self.book.hold("anthropic", batch.id, account, {m: Load(0, n, 1) for m, n in per_model.items()}, now)
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
            batch.results.append(self.runner.run(batch.id, request, batch.scenario))

    def _close(self, batch: AnthropicBatch, unprocessed: str | None, at: float) -> None:
        batch.processing_status = "ended"
        batch.ended_at = at
        batch.unprocessed = unprocessed if len(batch.results) < len(batch.requests) else None
        self.book.release("anthropic", batch.id, at)
        self.bill(
            [
                r.billed().ledger_row(
                    "anthropic",
                    batch.id,
                    r.custom_id,
                    r.model,
                    at,
                    cache_creation_input_tokens=r.cache_creation_input_tokens,
                )
                for r in batch.results
                if r.succeeded
            ]
        )
