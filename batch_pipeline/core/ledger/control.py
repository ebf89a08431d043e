"""Job-wide stop: a systemic failure (bad key, unknown model, no credit, retry spend over its cap) stops
the whole job once, with one message, instead of burning every item's budget on the same cause.

The stop is a record in the store. Runs that would submit refuse while it stands; the user fixes the
cause and resumes (``batch-pipeline run`` clears it), and the job continues where it stopped.

The stop, the pause and a shard's hold are typed records (``StopRecord``, ``PauseRecord``, ``ShardHold``), each
with a ``version``: 1 is the shape written before they were typed (no ``version`` key) and since. Unknown keys are
ignored (``extra="ignore"``): a record a newer release wrote still stops or pauses an older one, and these records
are only ever written whole and deleted, never edited, so nothing is lost.
"""

from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from batch_pipeline.core.errors import BatchPipelineError, SystemicError
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store

CONTROL_VERSION = 1


def _now() -> str:
    return datetime.now(UTC).isoformat()


class ControlRecord(BaseModel):
    """A job-control record: why, and since when."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    version: int = CONTROL_VERSION
    reason: str
    at: str = Field(default_factory=_now)


class StopRecord(ControlRecord):
    """The job stopped on a systemic cause; ``code`` names it (``core/troubleshooting.py`` explains each)."""

    code: str | None = None


class PauseRecord(ControlRecord):
    """A deploy or a human holds the job: nothing new is sent."""

    reason: str = "paused"


class ShardHold(ControlRecord):
    """One shard waits for a human (its paid results were lost at the provider)."""

    reason: str = "held"


def _read(store: Store, rel: str, model: type[ControlRecord]) -> Any:
    raw = store.read_json(rel)
    if not raw:
        return None
    try:
        return model.model_validate(raw)
    except ValidationError:  # unreadable: it still holds the job (a stop or a pause never lapses by accident)
        at = raw.get("at") if isinstance(raw, dict) else None
        return model.model_validate({"reason": f"unreadable record {rel}", "at": str(at or "?")})


R = TypeVar("R", bound=ControlRecord)


class JobPaused(BatchPipelineError):
    """The job is paused (a deploy, a human): nothing new is sent; open batches keep running at the provider."""

    retryable = True


class ControlFile(Generic[R]):
    """One control record at one path: written whole, read (an unreadable one still holds), taken away."""

    def __init__(self, store: Store, rel: str, model: type[R]):
        self.store, self.rel, self.model = store, rel, model

    def put(self, record: R) -> None:
        self.store.write_json(self.rel, record.model_dump(mode="json"))

    def get(self) -> R | None:
        return _read(self.store, self.rel, self.model)

    def take(self) -> R | None:
        """The record, deleted (None: there was none)."""
        held = self.get()
        if held is not None:
            self.store.delete(self.rel)
        return held


class JobControl:
    def __init__(self, store: Store, job: str):
        self.store, self.job = store, job
        self._stop = ControlFile(store, JobPaths(job).stop, StopRecord)
        self._pause = ControlFile(store, JobPaths(job).pause, PauseRecord)

    # -- pause: a deploy or a human holds the job; resume continues with nothing sent twice -------------------
    def pause(self, reason: str = "paused") -> None:
        self._pause.put(PauseRecord(reason=reason))

    def paused(self) -> PauseRecord | None:
        return self._pause.get()

    def unpause(self) -> PauseRecord | None:
        return self._pause.take()

    def stop(self, reason: str, *, code: str | None = None) -> None:
        self._stop.put(StopRecord(reason=reason, code=code))

    def current(self) -> StopRecord | None:
        return self._stop.get()

    def clear(self) -> StopRecord | None:
        return self._stop.take()

    # -- shard holds: one shard waits for a human (its paid results were lost at the provider); the rest go on ----
    def hold_shard(self, shard_id: str, reason: str) -> None:
        self.store.write_json(
            f"{JobPaths(self.job).root}/holds/{shard_id}.json", ShardHold(reason=reason).model_dump(mode="json")
        )

    def shard_holds(self) -> dict[str, str]:
        out = {}
        for rel in self.store.list_files(f"{JobPaths(self.job).root}/holds", suffix=".json"):
            hold = _read(self.store, rel, ShardHold) or ShardHold()
            out[rel.rsplit("/", 1)[1][:-5]] = hold.reason
        return out

    def release_holds(self) -> list[str]:
        """``resume``: the held shards are sent again (their lost items are paid for again: a human's decision)."""
        held = self.shard_holds()
        for shard_id in held:
            self.store.delete(f"{JobPaths(self.job).root}/holds/{shard_id}.json")
        return sorted(held)

    def ensure_running(self) -> None:
        held = self.paused()
        if held is not None:
            raise JobPaused(
                f"job {self.job} is paused since {held.at} ({held.reason}): nothing new is sent; "
                f"`batch-pipeline resume {self.job}` continues it"
            )
        stop = self.current()
        if stop is not None:
            raise SystemicError(
                f"job {self.job} is stopped since {stop.at}: {stop.reason} -- fix the cause, then resume "
                f"with `batch-pipeline run` (or `batch-pipeline resume {self.job}`)",
                code=stop.code,
            )
