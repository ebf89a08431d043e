"""Batch records and their clock-driven lifecycle (advanced lazily, never by a background thread).

validating -> in_progress -> finalizing -> completed; validating -> failed; in_progress -> expired at
``expires_at`` (or at the end of in_progress under the ``expire`` scenario); cancel -> cancelling -> cancelled.
Lines are processed one by one during in_progress, in the (shuffled) output order, so progress is visible.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from batch_pipeline.sandbox.errors import bad_request
from batch_pipeline.sandbox.openai.spooled_requests import SpooledRequests
from batch_pipeline.sandbox.openai.spooled_results import SpooledResults
from batch_pipeline.sandbox.scenarios import Scenario
from batch_pipeline.sandbox.store import BilledTokens, ScenarioRecord

TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
COMPLETION_WINDOW_S = 24 * 3600


def output_order(seed: bytes, count: int) -> list[int]:
    """A shuffle of the request indices, fixed by ``seed`` (the batch's input), that differs from input order
    when count >= 2 (results come back out of order, as providers' do)."""
    return digest_order(hashlib.sha256(seed).hexdigest(), count)


def digest_order(digest: str, count: int) -> list[int]:
    """``output_order`` of a seed whose SHA-256 hex digest is ``digest`` (an input hashed as it was read)."""
    order = list(range(count))
    random.Random(digest).shuffle(order)
    if count >= 2 and order == sorted(order):
        order = order[1:] + order[:1]
    return order


def lines_due(batch: Any, start: float, at: float) -> int:
    """How many of ``batch``'s requests are processed by clock time ``at``: progress is linear over the
    in-progress span from ``start``, and an ``expire`` scenario stops at its ``complete_share``. ``batch`` is
    an OpenAI ``BatchRecord`` or an Anthropic batch (``requests``, ``scenario``, ``duration``)."""
    total = len(batch.requests)
    quota = total
    if batch.scenario.name == "expire":
        quota = int(round(total * float(batch.scenario.param("complete_share"))))
    span = batch.duration("in_progress_s")
    elapsed = at - start
    # ``at`` is often ``start + span`` itself: (start + span) - start can fall a hair short of span in floating
    # point (by ~1e-7 s at epoch-sized clock values), which must not leave the last line unprocessed
    due = total if span <= 0 or elapsed + 1e-6 >= span else math.floor(total * max(elapsed, 0.0) / span)
    return min(due, quota)


@dataclass
class LineResult(BilledTokens):
    """One processed request: its status code, response body and the tokens it is billed for."""

    index: int
    custom_id: str
    status_code: int
    request_id: str
    body: dict[str, Any]
    body_json: str | None = field(default=None, compare=False, repr=False)  # ``body`` encoded, when made so


@dataclass
class BatchRecord(ScenarioRecord):
    """All the sandbox knows about one batch. Times are clock seconds (floats)."""

    NESTED: ClassVar[dict[str, Any]] = {"results": LineResult}

    id: str
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None
    model: str | None
    scenario: Scenario
    created_at: float
    requests: list[dict[str, Any]] | SpooledRequests  # a list in a state saved before the spool
    validation_errors: list[dict[str, Any]]
    order: list[int]
    status: str = "validating"
    # answers so far: appended to the batch's output and error parts in the spool (a list in a state saved before)
    results: list[LineResult] | SpooledResults = field(default_factory=list)
    in_progress_at: float | None = None
    finalizing_at: float | None = None
    completed_at: float | None = None
    failed_at: float | None = None
    expired_at: float | None = None
    cancelling_at: float | None = None
    cancelled_at: float | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    # set once the batch ended and its files were written: its counts and token sums, its requests and results
    # dropped (a finished 50k-line batch held them for good; a 1M-row job, 20 of them)
    totals: dict[str, int] | None = None

    def compact(self) -> None:
        """Keep only what the ``Batch`` object reports of a finished batch: its counts and usage."""
        if self.totals is None:
            self.totals = line_totals(self)
            if isinstance(self.requests, SpooledRequests):
                self.requests.release()
            if isinstance(self.results, SpooledResults):
                self.results.release()
            self.requests, self.results, self.order = [], [], []

    def to_json(self) -> dict[str, Any]:
        """Plain JSON; spooled requests and results as their names and counts (``asdict`` would copy the open
        handle and the pending lines). With spooled requests the output order is not saved either: it is the
        input's shuffle (50,000 numbers, in every save), made again from the link when the state is loaded."""
        kept = requests, results, order = self.requests, self.results, self.order
        if isinstance(requests, SpooledRequests):
            self.requests, self.order = [], []
        if isinstance(results, SpooledResults):
            self.results = []
        try:
            data = super().to_json()
        finally:
            self.requests, self.results, self.order = kept
        if isinstance(requests, SpooledRequests):
            data.update(requests=requests.to_json(), order=None if order else [])
        if isinstance(results, SpooledResults):
            data["results"] = results.to_json()
        return data

    @classmethod
    def load(cls, data: dict[str, Any], spool: Path) -> BatchRecord:
        """A batch from ``to_json`` whose spooled files are in ``spool``. Its answers' parts are cut back to the
        saved sizes; a running batch saved with a list of answers (before they were spooled) gets parts of them;
        a finished one is compacted."""
        results = data.get("results")
        batch = cls.from_json({**data, "results": []} if isinstance(results, dict) else data)
        if isinstance(batch.requests, dict):
            batch.requests = SpooledRequests.from_json(batch.requests, spool)
        if batch.order is None:  # the input's shuffle, not saved
            assert isinstance(batch.requests, SpooledRequests)
            batch.order = output_order(batch.requests.path.read_bytes(), len(batch.requests))
        if isinstance(results, dict):
            batch.results = SpooledResults.from_json(results, spool)
            batch.results.restore()
        elif batch.status not in TERMINAL:
            batch.results = SpooledResults.rebuilt(spool, batch.id, batch.results)
        if batch.status in TERMINAL:
            batch.compact()
        return batch

    @property
    def expires_at(self) -> float:
        """End of the 24 h completion window."""
        return self.created_at + COMPLETION_WINDOW_S


LineProcessor = Callable[[BatchRecord, int, float], LineResult]
TerminalHook = Callable[[BatchRecord], None]


def _ts(value: float | None) -> int | None:
    return None if value is None else int(value)


def line_totals(batch: BatchRecord) -> dict[str, int]:
    """A batch's request count, lines processed and succeeded, and the succeeded lines' token sums."""
    if batch.totals is not None:
        return batch.totals
    if isinstance(batch.results, SpooledResults):
        return {"requests": len(batch.requests), "processed": len(batch.results), **batch.results.totals}
    totals = {"requests": len(batch.requests), "processed": len(batch.results), "succeeded": 0}
    totals.update(input_tokens=0, cached_tokens=0, output_tokens=0)
    for result in batch.results:
        if result.status_code == 200:
            totals["succeeded"] += 1
            totals["input_tokens"] += result.input_tokens
            totals["cached_tokens"] += result.cached_tokens
            totals["output_tokens"] += result.output_tokens
    return totals


def batch_object(batch: BatchRecord) -> dict[str, Any]:
    """The API ``Batch`` object."""
    totals = line_totals(batch)
    succeeded = totals["succeeded"]
    failed = totals["processed"] - succeeded
    if batch.status in ("expired", "cancelled"):
        failed = totals["requests"] - succeeded
    total = 0 if batch.status in ("validating", "failed") else totals["requests"]
    input_tokens, output_tokens = totals["input_tokens"], totals["output_tokens"]
    errors = None
    if batch.status == "failed":
        errors = {"object": "list", "data": batch.validation_errors}
    return {
        "id": batch.id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "model": batch.model,
        "errors": errors,
        "input_file_id": batch.input_file_id,
        "completion_window": batch.completion_window,
        "status": batch.status,
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        "created_at": _ts(batch.created_at),
        "in_progress_at": _ts(batch.in_progress_at),
        "expires_at": _ts(batch.expires_at),
        "finalizing_at": _ts(batch.finalizing_at),
        "completed_at": _ts(batch.completed_at),
        "failed_at": _ts(batch.failed_at),
        "expired_at": _ts(batch.expired_at),
        "cancelling_at": _ts(batch.cancelling_at),
        "cancelled_at": _ts(batch.cancelled_at),
        "request_counts": {"total": total, "completed": succeeded, "failed": failed},
        "usage": {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": totals["cached_tokens"]},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens,
        },
        "metadata": batch.metadata,
    }


class Lifecycle:
    """Moves batches along their clock-driven lifecycle."""

    def __init__(self, process: LineProcessor, on_terminal: TerminalHook) -> None:
        self._process = process
        self._on_terminal = on_terminal

    def advance(self, batch: BatchRecord, now: float) -> bool:
        """Apply every transition due by ``now``; True if anything changed."""
        changed = False
        while batch.status not in TERMINAL:
            before = len(batch.results)
            moved = self._step(batch, now)
            changed = changed or moved or len(batch.results) != before
            if not moved:
                break
        return changed

    def cancel(self, batch: BatchRecord, now: float) -> None:
        """Start cancelling (results processed so far are kept); 400 if the batch already ended."""
        self.advance(batch, now)
        if batch.status in TERMINAL:
            raise bad_request(f"Cannot cancel a batch with status {batch.status}.", code="batch_not_cancellable")
        if batch.status == "cancelling":
            return
        if batch.status == "in_progress":
            self._process_until(batch, now)
        batch.status = "cancelling"
        batch.cancelling_at = now

    def _close(self, batch: BatchRecord, status: str, at: float) -> None:
        batch.status = status
        setattr(batch, f"{status}_at", at)
        self._on_terminal(batch)

    def _step(self, batch: BatchRecord, now: float) -> bool:
        status = batch.status
        if status == "validating":
            due = batch.created_at + batch.duration("validating_s")
            if batch.expires_at <= min(due, now):
                self._close(batch, "expired", batch.expires_at)
                return True
            if now < due:
                return False
            if batch.validation_errors:
                self._close(batch, "failed", due)
            else:
                batch.status, batch.in_progress_at = "in_progress", due
            return True
        if status == "in_progress":
            return self._step_in_progress(batch, now)
        if status in ("finalizing", "cancelling"):  # a wait, then the end it leads to
            finalizing = status == "finalizing"
            if finalizing:
                assert batch.finalizing_at is not None
                due = batch.finalizing_at + batch.duration("finalizing_s")
            else:
                due = batch.cancel_due(batch.cancelling_at)
            if now < due:
                return False
            self._close(batch, "completed" if finalizing else "cancelled", due)
            return True
        raise AssertionError(f"unexpected status {status}")

    def _step_in_progress(self, batch: BatchRecord, now: float) -> bool:
        assert batch.in_progress_at is not None
        end = batch.in_progress_at + batch.duration("in_progress_s")
        if batch.expires_at < end and now >= batch.expires_at:
            self._process_until(batch, batch.expires_at)
            self._close(batch, "expired", batch.expires_at)
            return True
        if now < end:
            self._process_until(batch, now)
            return False
        self._process_until(batch, end)
        if batch.scenario.name == "expire":
            self._close(batch, "expired", end)
        else:
            batch.status, batch.finalizing_at = "finalizing", end
        return True

    def _process_until(self, batch: BatchRecord, at: float) -> None:
        """Process the lines due by clock time ``at`` (progress is linear over in_progress)."""
        assert batch.in_progress_at is not None
        total = len(batch.requests)
        span = batch.duration("in_progress_s")
        due = lines_due(batch, batch.in_progress_at, at)
        while len(batch.results) < due:
            done = len(batch.results)
            finished_at = batch.in_progress_at + (span * (done + 1) / total if span > 0 else 0.0)
            batch.results.append(self._process(batch, batch.order[done], min(finished_at, at)))
        if isinstance(batch.results, SpooledResults):
            batch.results.flush()  # on disk before the state is saved
