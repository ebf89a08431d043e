"""What every provider's batch store shares: a record run under a scenario, kept by id and advanced to the clock.

Each provider (Anthropic message batches, Bedrock jobs, Gemini batches, Vertex jobs; OpenAI's records too) keeps
its own lifecycle and wire objects; the record's durations and JSON form, the store's bookkeeping (clear, advance
every record, newest first, save and restore) and the shape of a billed ledger row are written once here, so a
fix to persistence or billing reaches all providers at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar, Generic, Protocol, Self, TypeVar

from batch_pipeline.sandbox.quotas import LoadBook
from batch_pipeline.sandbox.scenarios import Scenario

Bill = Callable[[list[dict[str, Any]]], None]


def rfc3339(value: float | None) -> str | None:
    """Clock seconds as an RFC 3339 UTC timestamp with microseconds (None stays None)."""
    if value is None:
        return None
    return datetime.fromtimestamp(value, UTC).isoformat().replace("+00:00", "Z")


class Tokens(Protocol):
    """What a bill reads of a processed request: a ``BilledTokens``, or an answer that holds its counts."""

    input_tokens: int
    cached_tokens: int
    output_tokens: int


@dataclass(kw_only=True)
class BilledTokens:
    """The tokens one processed request is billed for if it succeeded (once, when its batch ends): all of its
    input, cache reads and writes included, the cache reads among it, and its output."""

    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0

    def ledger_row(
        self, provider: str, batch_id: str, custom_id: str, model: str | None, billed_at: float, **extra: int
    ) -> dict[str, Any]:
        """This request's row of the billing ledger (``extra``: a provider's own counts, such as cache writes)."""
        tokens = (self.input_tokens, self.cached_tokens, self.output_tokens)
        return ledger_row(provider, batch_id, custom_id, model, *tokens, billed_at, **extra)


def ledger_row(
    provider: str,
    batch_id: str,
    custom_id: str,
    model: str | None,
    input_tokens: int,
    cached_tokens: int,
    output_tokens: int,
    billed_at: float,
    **extra: int,
) -> dict[str, Any]:
    """A billed request's row of the ledger (``BilledTokens.ledger_row``; a batch's billing part is read back
    through this directly, without a ``BilledTokens`` a row)."""
    return {
        "provider": provider,
        "batch_id": batch_id,
        "custom_id": custom_id,
        "model": model,
        "input_tokens": input_tokens,
        "cached_tokens": cached_tokens,
        **extra,
        "output_tokens": output_tokens,
        "billed_at": billed_at,
    }


class ScenarioRecord:
    """Mixin for a record dataclass run under a ``scenario``: its durations and its plain-JSON form.

    ``NESTED`` names the list fields that hold dataclasses, so ``from_json`` can rebuild them."""

    scenario: Scenario
    NESTED: ClassVar[dict[str, Callable[..., Any]]] = {}

    def duration(self, key: str) -> float:
        """A lifecycle duration (``validating_s``, ``in_progress_s``, ...) from the record's scenario."""
        return float(self.scenario.param(key))

    def cancel_due(self, requested_at: float | None) -> float:
        """When a cancel requested at ``requested_at`` completes (``cancelling_s`` later)."""
        assert requested_at is not None, "a record that is cancelling knows when the cancel was asked"
        return requested_at + self.duration("cancelling_s")

    def to_json(self) -> dict[str, Any]:
        """Plain JSON for persistence."""
        data = asdict(self)  # type: ignore[call-overload]
        data["scenario"] = self.scenario.to_json()
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        """Inverse of ``to_json``."""
        data = dict(data)
        data["scenario"] = Scenario(**data["scenario"])
        for name, kind in cls.NESTED.items():
            data[name] = [kind(**item) for item in data[name]]
        return cls(**data)


class ProcessedRecord(ScenarioRecord):
    """A record whose requests are processed over ``in_progress_s``, after ``validating_s`` from its creation."""

    created_at: float

    @property
    def processing_start(self) -> float:
        return self.created_at + self.duration("validating_s")

    @property
    def processing_end(self) -> float:
        return self.processing_start + self.duration("in_progress_s")


R = TypeVar("R", bound=ScenarioRecord)


class RecordStore(Generic[R]):
    """One provider's records by id (callers hold the state lock). Subclasses give the lifecycle (``advance``)."""

    record_type: type[R]

    def __init__(self, load: LoadBook | None = None) -> None:
        self.book = load if load is not None else LoadBook()
        self.records: dict[str, R] = {}

    @staticmethod
    def key(record: R) -> str:
        """The id a record is kept under."""
        return str(record.id)  # type: ignore[attr-defined]

    def get(self, record_id: str) -> R:
        """A record by id; the provider's own 404 (``not_found``) when there is none."""
        record = self.records.get(record_id)
        if record is None:
            raise self.not_found(record_id)
        return record

    def not_found(self, record_id: str) -> Exception:
        """The error the provider answers for an unknown id."""
        return LookupError(record_id)

    def add(self, record: R) -> R:
        self.records[self.key(record)] = record
        return record

    def clear(self) -> None:
        """Forget every record."""
        self.records.clear()

    def advance(self, record: R, now: float) -> bool:
        """Apply every transition due by ``now``; True if anything changed."""
        raise NotImplementedError

    def advance_all(self, now: float) -> bool:
        """Bring every record up to the clock; True if any changed."""
        changed = False
        for record in self.records.values():
            changed = self.advance(record, now) or changed
        return changed

    def newest_first(self) -> list[R]:
        """Every record, most recently created first."""
        return list(reversed(self.records.values()))

    def to_json(self) -> list[dict[str, Any]]:
        """Every record as plain JSON."""
        return [record.to_json() for record in self.records.values()]

    def load(self, saved: Iterable[dict[str, Any]] | None) -> None:
        """Restore records saved by ``to_json``."""
        self.clear()
        for data in saved or []:
            self.add(self.record_type.from_json(data))
