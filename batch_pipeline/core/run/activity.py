"""What a run did, read from the attempt log: the events written since it started, in words whose counts add up.

The CLI's live status line and its after-pass line both say what happened (a batch sent, re-attached, collected; a
shard answered inline or on the tail backend; an intent closed with nothing sent), not what the plan said would.
A batch collected in this run but sent by an earlier one is named as such, so "1 sent, 2 collected" never stands
alone; a shard answered without a batch (a stream backend, the tail rescue) is not counted as a collected batch.
Only the records that appeared since the start are read, each once.
"""

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, TypeVar

from batch_pipeline.core.ledger.attempts import AttemptEvent, CollectedRecord, IntentRecord, SubmittedRecord
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store

Record = TypeVar("Record", bound=AttemptEvent)


@dataclass
class Did:
    """Counts of what happened since the start (``Activity.since``)."""

    sent: int = 0  # batches created
    reattached: int = 0  # batches an orphaned intent had made, found at the provider (resolve)
    collected: int = 0  # batches collected
    collected_earlier: int = 0  # of those, sent before the start
    open: int = 0  # batches sent or re-attached since the start and not collected yet
    answered: Counter = field(default_factory=Counter)  # (how, backend) -> shard runs answered without a batch
    answers: Counter = field(default_factory=Counter)  # (how, backend) -> their rows
    closed: int = 0  # intents closed with nothing sent, or runs interrupted (abandoned)

    @property
    def anything(self) -> bool:
        return bool(self.sent or self.reattached or self.collected or self.answered or self.closed)

    def describe(self) -> str:
        parts = []
        if self.sent or self.reattached or self.collected:
            batches = [f"{self.sent} batch(es) sent"] + ([f"{self.reattached} re-attached"] if self.reattached else [])
            notes = ([f"{self.collected_earlier} sent by an earlier run"] if self.collected_earlier else []) + (
                [f"{self.open} still open"] if self.open else []
            )
            parts.append(
                ", ".join(batches) + f", {self.collected} collected" + (f" ({'; '.join(notes)})" if notes else "")
            )
        for (how, backend), runs in sorted(self.answered.items()):
            parts.append(f"{runs} shard run(s) {how} on {backend} ({self.answers[(how, backend)]} answers)")
        if self.closed:
            parts.append(f"{self.closed} attempt(s) closed with nothing more sent")
        return "; ".join(parts) or "nothing sent or collected"


class Activity:
    """The attempt events of job ``job`` that appear after this object is made."""

    def __init__(self, store: Store, job: str, tail_backend: str | None = None):
        self.store, self.root, self.tail_backend = store, f"{JobPaths(job).root}/attempts", tail_backend
        self._records: dict[str, Any] = {}
        self.before = set(self._events())

    def _events(self) -> list[str]:
        try:
            return self.store.list_files(self.root, recursive=True, suffix=".json")
        except (FileNotFoundError, OSError):
            return []

    def _read(self, rel: str, kind: type[Record]) -> Record | None:
        """One attempt event's typed record (None when torn or gone), read once."""
        if rel not in self._records:
            raw = self.store.read_json(rel)
            self._records[rel] = kind.model_validate(raw) if raw else None
        return self._records[rel]

    def since(self) -> Did:
        now = set(self._events())
        by_attempt: dict[str, dict[str, str]] = {}
        for rel in now:
            stem, _, name = rel.rpartition("/")
            attempt, _, rest = name.partition(".")
            by_attempt.setdefault(f"{stem}/{attempt}", {})[rest.removesuffix(".json")] = rel
        did = Did()
        for events in by_attempt.values():
            new = {e for e, rel in events.items() if rel not in self.before}
            if not new:
                continue
            submitted = events.get("submitted")
            mine = "submitted" in new
            if mine:
                record = self._read(submitted, SubmittedRecord) if submitted else None
                if record is not None and record.reattached:
                    did.reattached += 1
                else:
                    did.sent += 1
            if "collected" in new and submitted:
                did.collected += 1
                did.collected_earlier += not mine
            elif "collected" in new and "intent" in events:  # answered without a batch: a stream run
                intent = self._read(events["intent"], IntentRecord)
                backend = (intent.backend if intent else None) or "?"
                how = (
                    "answered by the fallback"
                    if intent is not None and intent.stage == "fallback"
                    else "rescued"
                    if backend == self.tail_backend
                    else "answered inline"
                )
                did.answered[(how, backend)] += 1
                collected = self._read(events["collected"], CollectedRecord)
                did.answers[(how, backend)] += collected.rows if collected else 0
            elif mine and "collected" not in events and "abandoned" not in events:
                did.open += 1
            if "abandoned" in new:
                did.closed += 1
        return did
