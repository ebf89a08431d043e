"""Job-wide stop: a systemic failure (bad key, unknown model, no credit, retry spend over its cap) stops
the whole job once, with one message, instead of burning every item's budget on the same cause.

The stop is a record in the store. Runs that would submit refuse while it stands; the user fixes the
cause and resumes (``batch-pipeline run`` clears it), and the job continues where it stopped.
"""

from datetime import UTC, datetime

from batch_pipeline.core.errors import BatchPipelineError, SystemicError
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store


class JobPaused(BatchPipelineError):
    """The job is paused (a deploy, a human): nothing new is sent; open batches keep running at the provider."""

    retryable = True


class JobControl:
    def __init__(self, store: Store, job: str):
        self.store, self.job = store, job
        self.rel = JobPaths(job).stop
        self.pause_rel = JobPaths(job).pause

    # -- pause: a deploy or a human holds the job; resume continues with nothing sent twice -------------------
    def pause(self, reason: str = "paused") -> None:
        self.store.write_json(self.pause_rel, {"reason": reason, "at": datetime.now(UTC).isoformat()})

    def paused(self) -> dict | None:
        return self.store.read_json(self.pause_rel)

    def unpause(self) -> dict | None:
        held = self.paused()
        if held is not None:
            self.store.delete(self.pause_rel)
        return held

    def stop(self, reason: str, *, code: str | None = None) -> None:
        self.store.write_json(self.rel, {"reason": reason, "code": code, "at": datetime.now(UTC).isoformat()})

    def current(self) -> dict | None:
        return self.store.read_json(self.rel)

    def clear(self) -> dict | None:
        stop = self.current()
        if stop is not None:
            self.store.delete(self.rel)
        return stop

    # -- shard holds: one shard waits for a human (its paid results were lost at the provider); the rest go on ----
    def hold_shard(self, shard_id: str, reason: str) -> None:
        self.store.write_json(
            f"{JobPaths(self.job).root}/holds/{shard_id}.json", {"reason": reason, "at": datetime.now(UTC).isoformat()}
        )

    def shard_holds(self) -> dict[str, str]:
        out = {}
        for rel in self.store.list_files(f"{JobPaths(self.job).root}/holds", suffix=".json"):
            record = self.store.read_json(rel) or {}
            out[rel.rsplit("/", 1)[1][:-5]] = str(record.get("reason", "held"))
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
                f"job {self.job} is paused since {held['at']} ({held['reason']}): nothing new is sent; "
                f"`batch-pipeline resume {self.job}` continues it"
            )
        stop = self.current()
        if stop is not None:
            raise SystemicError(
                f"job {self.job} is stopped since {stop['at']}: {stop['reason']} -- fix the cause, then resume "
                f"with `batch-pipeline run` (or `batch-pipeline resume {self.job}`)",
                code=stop.get("code"),
            )
