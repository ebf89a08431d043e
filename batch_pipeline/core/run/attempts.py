"""Attempt records: an intent before every paid call, then what the provider said, then the collection.

Each event is its own immutable JSON object (``attempt-0003.intent.json``, ``.submitted.json``,
``.collected.json``, ``.abandoned.json``), so a crash at any point leaves a readable history: an intent
without a submission means "we may or may not have paid"; the runner asks the provider (``find``)
before it ever submits those items again. A collected attempt may get ``.discarded.json`` once its files at
the provider are deleted (``core/run/hygiene.py``); it stays collected and closed.
"""

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.state.machine import check_attempt_event, last_event
from batch_pipeline.core.store import Store

EVENTS = ("intent", "submitted", "collected", "abandoned", "discarded")  # discarded: core/run/hygiene.py


@dataclass
class Attempt:
    number: int
    records: dict[str, dict[str, Any]]

    @property
    def key(self) -> str:
        return self.records["intent"]["key"]

    @property
    def request_ids(self) -> list[str]:
        return self.records["intent"]["request_ids"]

    @property
    def submitted(self) -> dict[str, Any] | None:
        return self.records.get("submitted")

    @property
    def closed(self) -> bool:
        return "collected" in self.records or "abandoned" in self.records

    @property
    def open(self) -> bool:
        return "intent" in self.records and not self.closed

    @property
    def canary(self) -> bool:
        return bool(self.records["intent"].get("canary"))

    @property
    def backend(self) -> str | None:
        return self.records["intent"].get("backend")


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


class AttemptLog:
    def __init__(self, store: Store, job: str, shard_id: str):
        self.store, self.paths, self.shard_id = store, JobPaths(job), shard_id

    def all(self) -> list[Attempt]:
        by_number: dict[int, dict[str, dict[str, Any]]] = {}
        for rel in self.store.list_files(self.paths.attempts(self.shard_id), suffix=".json"):
            name = rel.rsplit("/", 1)[1]  # attempt-0003.intent.json
            stem, event, _ = name.split(".")
            record = self.store.read_json(rel)
            if record is not None and event in EVENTS:
                by_number.setdefault(int(stem.split("-")[1]), {})[event] = record
        return [Attempt(n, recs) for n, recs in sorted(by_number.items()) if "intent" in recs]

    def next_number(self) -> int:
        attempts = self.all()
        return attempts[-1].number + 1 if attempts else 1

    def events(self, attempt: int) -> dict[str, bool]:
        return {e: True for e in EVENTS if self.store.exists(self.paths.attempt_event(self.shard_id, attempt, e))}

    def record(self, attempt: int, event: str, payload: dict[str, Any]) -> None:
        """Append one event; an event the attempt's state does not allow raises ``IllegalTransition``."""
        check_attempt_event(self.shard_id, attempt, last_event(self.events(attempt)), event)
        self.store.write_json(self.paths.attempt_event(self.shard_id, attempt, event), {**payload, "at": now_iso()})

    def record_once(self, attempt: int, event: str, payload: dict[str, Any]) -> bool:
        """Append an event two runs may race to write (a collection and the publish run's sweep): the first one
        wins, the other gets False. An event the attempt's state does not allow raises ``IllegalTransition``."""
        events = self.events(attempt)
        if event in events:
            return False
        check_attempt_event(self.shard_id, attempt, last_event(events), event)
        return self.store.create_json_exclusive(
            self.paths.attempt_event(self.shard_id, attempt, event), {**payload, "at": now_iso()}
        )

    def create_intent(self, attempt: int, payload: dict[str, Any]) -> bool:
        """Record the intent only if no one else claimed this attempt number (True if we did)."""
        return self.store.create_json_exclusive(
            self.paths.attempt_event(self.shard_id, attempt, "intent"), {**payload, "at": now_iso()}
        )
