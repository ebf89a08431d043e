"""Attempt records: an intent before every paid call, then what the provider said, then the collection.

Each event is its own immutable JSON object (``attempt-0003.intent.json``, ``.submitted.json``,
``.collected.json``, ``.abandoned.json``), so a crash at any point leaves a readable history: an intent
without a submission means "we may or may not have paid"; the runner asks the provider (``find``)
before it ever submits those items again. A collected attempt may get ``.discarded.json`` once its files at
the provider are deleted (``core/run/hygiene.py``); it stays collected and closed.
"""

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from batch_pipeline.core.ledger.executor import BatchHandle
from batch_pipeline.core.ledger.machine import check_attempt_event, last_event
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store

EVENTS = ("intent", "submitted", "collected", "abandoned", "discarded")  # discarded: core/run/hygiene.py
ATTEMPT_VERSION = 1


R = TypeVar("R", bound="AttemptEvent")


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


class AttemptEvent(BaseModel):
    """One event of an attempt, as it is stored. Version 1 is the shape written before the records were typed (no
    ``version`` key) and since. Unknown keys are kept (``extra="allow"``): the log is the audit history of paid
    calls, written once and never rewritten, so a newer writer's fields (or a provider's note) stay readable."""

    model_config = ConfigDict(extra="allow", frozen=True)
    version: int = ATTEMPT_VERSION
    at: str = Field(default_factory=now_iso)


class IntentHead(AttemptEvent):
    """An intent without its request IDs: all that the readers of an attempt's state need (the summaries, the
    polls, the sweeps, the report). ``AttemptLog.all(request_ids=False)`` hands these back; they are kept for
    every intent once read, so those readers parse no intent twice (``IntentCache``)."""

    key: str
    backend: str | None = None
    lease_token: int | str | None = None  # the fencing token (core/run/lease.py) it ran under
    requests: int | None = None
    canary: bool = False
    stage: str = "primary"  # ledger.fallback.Stage: the fallback's attempts are its runner's
    capacity: int | None = None  # the capacity ledger's holding (core/ledger/capacity.py)
    account: str | None = None


class IntentRecord(IntentHead):
    """Written before a paid call: which items, under which idempotency key, on which backend."""

    request_ids: list[str]

    def head(self) -> IntentHead:
        """This record without its request IDs (unknown keys kept, as read)."""
        return IntentHead.model_validate(self.model_dump(exclude={"request_ids"}))


class SubmittedRecord(AttemptEvent):
    """The provider accepted the batch: its handle (``BatchHandle``)."""

    backend: str
    batch_id: str
    key: str
    input_file_id: str | None = None
    account: str | None = None
    reattached: bool = False  # found at the provider after a crash between the call and this record

    def handle(self) -> BatchHandle:
        return BatchHandle(self.backend, self.batch_id, self.key, self.input_file_id, self.account)


class CollectedRecord(AttemptEvent):
    """The attempt ended at the provider and what it answered is stored (or lost, or refused)."""

    state: str  # the provider's final state (BatchState value), or "lost"
    rows: int = 0
    succeeded: int = 0
    errors: list[str] = Field(default_factory=list)
    systemic: dict[str, Any] | None = None
    provider_counts: dict[str, int] | None = None
    provider_state: str | None = None  # of a lost batch
    lost: str | None = None
    refused: dict[str, Any] | None = None  # refused for capacity after it was accepted: nothing billed


class AbandonedRecord(AttemptEvent):
    """The attempt was closed without a collection (nothing at the provider, interrupted, refused)."""

    reason: str
    rows: int | None = None
    refused: dict[str, Any] | None = None  # a quota refusal: nothing billed
    possibly_billed: int | None = None  # requests in flight at a kill: sent, no answer
    possibly_billed_usd: float | None = None


class DiscardedRecord(AttemptEvent):
    """The batch's copies at the provider were deleted (``core/run/hygiene.py``)."""

    backend: str | None = None
    batch_id: str | None = None
    deleted: list[str] = Field(default_factory=list)


EVENT_RECORDS: dict[str, type[AttemptEvent]] = {
    "intent": IntentRecord,
    "submitted": SubmittedRecord,
    "collected": CollectedRecord,
    "abandoned": AbandonedRecord,
    "discarded": DiscardedRecord,
}


def event_record(event: str, payload: dict[str, Any] | AttemptEvent) -> AttemptEvent:
    """The typed record of one event (a payload dict is checked against the event's record)."""
    if isinstance(payload, AttemptEvent):
        return payload
    return EVENT_RECORDS[event].model_validate(payload)


def _stored(record: AttemptEvent) -> dict[str, Any]:
    """What is written: the writer's fields, the time and the version (defaults left out, as before)."""
    return {**record.model_dump(mode="json", exclude_unset=True), "version": record.version, "at": record.at}


class _Event(Generic[R]):
    """An attempt's record of the event named like the attribute, typed; None until the event happened."""

    def __init__(self, kind: type[R]) -> None:
        self.kind = kind

    def __set_name__(self, owner: type, name: str) -> None:
        self.event = name

    def __get__(self, attempt: "Attempt", owner: type) -> R | None:
        record = attempt.records.get(self.event)
        assert record is None or isinstance(record, self.kind)
        return record


@dataclass
class Attempt:
    number: int
    records: dict[str, AttemptEvent] = field(default_factory=dict)  # event -> its record

    @property
    def intent(self) -> IntentHead:
        record = self.records["intent"]
        assert isinstance(record, IntentHead)
        return record

    submitted = _Event(SubmittedRecord)
    collected = _Event(CollectedRecord)
    abandoned = _Event(AbandonedRecord)
    discarded = _Event(DiscardedRecord)

    @property
    def key(self) -> str:
        return self.intent.key

    @property
    def request_ids(self) -> list[str]:
        record = self.records["intent"]
        if not isinstance(record, IntentRecord):
            raise TypeError(f"attempt {self.number}: its log was read without request IDs (request_ids=False)")
        return record.request_ids

    @property
    def closed(self) -> bool:
        return "collected" in self.records or "abandoned" in self.records

    @property
    def open(self) -> bool:
        return "intent" in self.records and not self.closed

    @property
    def canary(self) -> bool:
        return self.intent.canary

    @property
    def backend(self) -> str | None:
        return self.intent.backend


class IntentCache:
    """Parsed intents, by (file, size, mtime): an intent holds every request ID its attempt sent (3.4 MB of JSON
    for 50,000, ~9-15 ms to parse), and a shard's log is read several times a collection (its summary at each
    event, the polls, the collection, the budget guard, the sweeps, the report). An intent is created exclusively
    and never rewritten, so a file of the same size and mtime is the same record.

    Two tiers: whole records, bounded by the request IDs held, least recently read first out (200,000, ~24 MB,
    covers the shards a run collects at once; at 500,000 a 1M-row run peaked 50-90 MB higher), and every intent's
    head (``IntentHead``, no IDs; up to ``max_heads``), so the readers that go over every shard in turn (the
    sweeps, the report, a summary) parse each intent once per process, not once per read. Thread-safe (shards are
    collected on several threads). A record is shared by its readers, as the typed records are frozen: nothing
    changes ``request_ids`` in place."""

    def __init__(self, max_ids: int = 200_000, max_heads: int = 100_000):
        self.max_ids, self.max_heads = max_ids, max_heads
        self._records: OrderedDict[tuple[str, int, int], IntentRecord] = OrderedDict()
        self._heads: OrderedDict[tuple[str, int, int], IntentHead] = OrderedDict()
        self._ids = 0
        self._lock = threading.Lock()

    def get(self, key: tuple[str, int, int]) -> "IntentRecord | None":
        with self._lock:
            record = self._records.get(key)
            if record is not None:
                self._records.move_to_end(key)
            return record

    def head(self, key: tuple[str, int, int]) -> IntentHead | None:
        with self._lock:
            head = self._heads.get(key)
            if head is not None:
                self._heads.move_to_end(key)
            return head

    def put(self, key: tuple[str, int, int], record: "IntentRecord") -> IntentHead:
        """Keep ``record`` (unless it alone passes the bound) and its head; the head kept is returned."""
        head, size = record.head(), len(record.request_ids)  # a put follows a parse: the head's validation is small
        with self._lock:
            head = self._heads.setdefault(key, head)
            self._heads.move_to_end(key)
            while len(self._heads) > self.max_heads:
                self._heads.popitem(last=False)
            if size > self.max_ids or key in self._records:
                return head
            self._records[key] = record
            self._ids += size
            while self._ids > self.max_ids:
                _, dropped = self._records.popitem(last=False)
                self._ids -= len(dropped.request_ids)
        return head


INTENTS = IntentCache()


class AttemptLog:
    def __init__(self, store: Store, job: str, shard_id: str):
        self.store, self.paths, self.shard_id = store, JobPaths(job), shard_id

    def all(self, request_ids: bool = True) -> list[Attempt]:
        """Every attempt with an intent, by number. ``request_ids=False``: each intent as its head
        (``IntentHead``), for a reader that never asks an attempt for its request IDs (those raise)."""
        by_number: dict[int, dict[str, AttemptEvent]] = {}
        for rel, size, mtime in self.store.file_stats(self.paths.attempts(self.shard_id)):
            parts = rel.rsplit("/", 1)[1].split(".")  # attempt-0003.intent.json
            if len(parts) != 3 or parts[2] != "json" or parts[1] not in EVENTS:
                continue
            stem, event, _ = parts
            record = self._intent(rel, size, mtime, request_ids) if event == "intent" else self._read(event, rel)
            if record is not None:
                by_number.setdefault(int(stem.split("-")[1]), {})[event] = record
        return [Attempt(n, recs) for n, recs in sorted(by_number.items()) if "intent" in recs]

    def _read(self, event: str, rel: str) -> AttemptEvent | None:
        payload = self.store.read_json(rel)
        return None if payload is None else event_record(event, payload)

    def _intent(self, rel: str, size: int, mtime: int | None, request_ids: bool) -> AttemptEvent | None:
        """The intent at ``rel`` (or its head), parsed once per file version (``IntentCache``); a store without
        mtimes reads it."""
        key = (self.store.uri(rel), size, mtime) if mtime is not None else None
        if key is not None:
            cached = INTENTS.get(key) if request_ids else INTENTS.head(key)
            if cached is not None:
                return cached
        record = self._read("intent", rel)
        if not isinstance(record, IntentRecord):
            return record
        head = INTENTS.put(key, record) if key is not None else record.head()
        return record if request_ids else head

    def next_number(self) -> int:
        attempts = self.all()
        return attempts[-1].number + 1 if attempts else 1

    def events(self, attempt: int) -> dict[str, bool]:
        return {e: True for e in EVENTS if self.store.exists(self.paths.attempt_event(self.shard_id, attempt, e))}

    def record(self, attempt: int, event: str, payload: dict[str, Any] | AttemptEvent) -> None:
        """Append one event; an event the attempt's state does not allow raises ``IllegalTransition``."""
        record = event_record(event, payload)
        check_attempt_event(self.shard_id, attempt, last_event(self.events(attempt)), event)
        self.store.write_json(self.paths.attempt_event(self.shard_id, attempt, event), _stored(record))

    def record_once(self, attempt: int, event: str, payload: dict[str, Any] | AttemptEvent) -> bool:
        """Append an event two runs may race to write (a collection and the publish run's sweep): the first one
        wins, the other gets False. An event the attempt's state does not allow raises ``IllegalTransition``."""
        events = self.events(attempt)
        if event in events:
            return False
        record = event_record(event, payload)
        check_attempt_event(self.shard_id, attempt, last_event(events), event)
        return self.store.create_json_exclusive(
            self.paths.attempt_event(self.shard_id, attempt, event), _stored(record)
        )

    def create_intent(self, attempt: int, payload: dict[str, Any] | IntentRecord) -> bool:
        """Record the intent only if no one else claimed this attempt number (True if we did)."""
        record = event_record("intent", payload)
        return self.store.create_json_exclusive(
            self.paths.attempt_event(self.shard_id, attempt, "intent"), _stored(record)
        )
