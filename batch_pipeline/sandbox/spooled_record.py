"""A provider's batch record whose requests and answers are in the spool (Anthropic batches, Gemini batches, Vertex
and Bedrock jobs): how it is saved (names and sizes, not lines), loaded (parts cut back to the saved sizes; a state
saved when they were lists gets them spooled) and compacted once it ended (its counts kept, its files dropped)."""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar, Self, TypeVar

from batch_pipeline.sandbox.spooled_lines import SpooledLines
from batch_pipeline.sandbox.spooled_parts import SpooledParts
from batch_pipeline.sandbox.store import ProcessedRecord, RecordStore


class SpooledRecord(ProcessedRecord):
    """Mixin for a record dataclass with requests (``REQUESTS`` names the field), ``order``, ``results`` and
    ``totals`` (None until it ended). Requests are ``SpooledLines`` with the processing order as their ``order``
    column, answers ``PARTS_TYPE`` parts; either is a list in a state saved before the spool (and a Gemini inline
    batch keeps both as lists)."""

    REQUESTS: ClassVar[str] = "requests"
    PARTS_TYPE: ClassVar[type[SpooledParts]] = SpooledParts
    order: Any
    results: Any
    totals: dict[str, int] | None

    @property
    def spooled_requests(self) -> SpooledLines | None:
        value = getattr(self, self.REQUESTS)
        return value if isinstance(value, SpooledLines) else None

    @property
    def ended(self) -> bool:
        raise NotImplementedError

    def record_id(self) -> str:
        """The id its spool files are named after."""
        return str(self.id)

    def new_parts(self, spool: Path) -> SpooledParts:
        """Empty parts for this record's answers."""
        return self.PARTS_TYPE(spool, self.record_id())

    def tally(self) -> dict[str, int]:
        """Requests, answers so far and the answers' sums (``PARTS_TYPE.TOTAL_KEYS``); kept alone once it ended."""
        if self.totals is not None:
            return self.totals
        requests = len(getattr(self, self.REQUESTS))
        if isinstance(self.results, SpooledParts):
            return {"requests": requests, "processed": len(self.results), **self.results.totals}
        return {"requests": requests, "processed": len(self.results), **self.sums(self.results)}

    def sums(self, answers: list[Any]) -> dict[str, int]:
        """``TOTAL_KEYS`` summed over answers held as a list (by default: how many succeeded)."""
        return {"succeeded": sum(1 for answer in answers if answer.succeeded)}

    def compact(self) -> None:
        """It ended and its files were written: keep its tally, drop its requests, order and answers."""
        if self.totals is None:
            self.totals = self.tally()
        self.release()
        setattr(self, self.REQUESTS, [])
        self.results, self.order = [], []

    def release(self) -> None:
        """Its spool files go (it ended, was deleted, or the sandbox resets)."""
        if (requests := self.spooled_requests) is not None:
            requests.release()
        if isinstance(self.results, SpooledParts):
            self.results.release()

    def to_json(self) -> dict[str, Any]:
        """Plain JSON; spooled requests and answers as their names and counts, and no order (in the sidecar)."""
        requests, results, order = getattr(self, self.REQUESTS), self.results, self.order
        spooled_requests, spooled_results = isinstance(requests, SpooledLines), isinstance(results, SpooledParts)
        if spooled_requests:
            setattr(self, self.REQUESTS, [])
            self.order = []
        if spooled_results:
            self.results = []
        try:
            data = super().to_json()
        finally:
            setattr(self, self.REQUESTS, requests)
            self.results, self.order = results, order
        if spooled_requests:
            data.update({self.REQUESTS: requests.to_json(), "order": None})
        if spooled_results:
            data["results"] = results.to_json()
        return data

    @classmethod
    def load(cls, data: dict[str, Any], spool: Path) -> Self:
        """A record from ``to_json`` whose spool files are in ``spool``: answers' parts cut back to the saved sizes.
        A running record saved with lists gets them spooled; an ended one, ``finish_loaded``."""
        requests, results = data.get(cls.REQUESTS), data.get("results")
        record = cls.from_json(
            {
                **data,
                cls.REQUESTS: [] if isinstance(requests, dict) else requests,
                "results": [] if isinstance(results, dict) else results,
            }
        )
        if isinstance(requests, dict):
            lines = SpooledLines.from_json(requests, spool)
            setattr(record, cls.REQUESTS, record.spool_requests(lines))
            record.order = lines.column("order")
        if isinstance(results, dict):
            record.results = cls.PARTS_TYPE.from_json(results, spool)
            record.results.restore()
        elif record.keeps_lists() or record.totals is not None:
            pass  # held in memory by design, or ended and compacted
        elif record.ended:
            record.finish_loaded(spool)
        else:  # running, saved with lists
            record.results = record.rebuild_parts(spool)
            if not isinstance(requests, dict):
                listed = getattr(record, cls.REQUESTS)
                path = spool / f"{record.record_id()}.requests"
                order = array("q", record.order)
                lines = SpooledLines.write(path, (record.request_line(r) for r in listed), order=order)
                setattr(record, cls.REQUESTS, record.spool_requests(lines))
                record.order = lines.column("order")
        return record

    def rebuild_parts(self, spool: Path) -> SpooledParts:
        """Parts holding the answers of a record saved with them as a list (whatever parts were there go)."""
        parts = self.new_parts(spool)
        parts.release()
        for answer in self.results:
            self.keep_answer(parts, answer)
        parts.flush()
        return parts

    def keep_answer(self, parts: SpooledParts, answer: Any) -> None:
        """Encode one answer into the parts (a provider that routes answers to parts says where)."""
        parts.append(answer)

    def keeps_lists(self) -> bool:
        """True for a record that holds its requests and answers in memory (a Gemini inline batch)."""
        return False

    def request_line(self, request: Any) -> dict[str, Any]:
        """A request as its spooled line (a saved list's item)."""
        return dict(request)

    def spool_requests(self, lines: SpooledLines) -> SpooledLines:
        """The provider's view of its spooled lines (its ``SpooledLines`` subclass, if any)."""
        return lines

    def finish_loaded(self, spool: Path) -> None:
        """An ended record saved with lists: write what it left behind (if anything) and compact it."""
        self.compact()


S = TypeVar("S", bound=SpooledRecord)


class SpooledStore(RecordStore[S]):
    """A provider's records whose files are in the spool at ``spool``: loaded from it, and released with them."""

    spool: Path

    def clear(self) -> None:
        """Forget every record, and its spool files."""
        for record in getattr(self, "records", {}).values():
            self.drop_files(record)
        super().clear()

    def drop_files(self, record: S) -> None:
        """A record goes (deleted, or the sandbox resets): so do its spool files."""
        record.release()

    def load(self, saved: Iterable[dict[str, Any]] | None) -> None:
        """Restore records saved by ``to_json``, their files in the spool."""
        self.clear()
        for data in saved or []:
            self.add(self.record_type.load(data, self.spool))
