"""Provider-side data hygiene (``backend.settings.retention``): once an attempt's results are stored, the copies
the provider still holds (the uploaded input, the output and error files, the batch, the objects in our bucket)
are deleted there.

Never before the results are stored: an attempt is discarded only once its ``collected`` record exists (written
after every result part). A failed delete never fails a collection: it is logged and left for the sweep
(``sweep_leftovers``), which the publish run calls, so a kill between storing and deleting leaves the files only
until the job's next publish. Deleting is idempotent (a not-found counts as deleted) and ``discarded`` is written
once (``record_once``), so a collection and a sweep racing each other do no harm.

With ``keep`` nothing is deleted and nothing recorded: a collected attempt without ``discarded`` is one whose
copies may still be at the provider (``leftovers``), and a later switch to ``delete`` sweeps them.
"""

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from batch_pipeline.core.errors import BatchPipelineError
from batch_pipeline.core.ledger.attempts import Attempt, AttemptLog
from batch_pipeline.core.ledger.executor import BatchHandle, DiscardableBatch
from batch_pipeline.core.manifest.shards import Manifest
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.spec.quota import Retention
from batch_pipeline.core.store import Store

log = logging.getLogger(__name__)

DISCARDED = "discarded"


def deletes(executor: object) -> bool:
    """The executor can delete an attempt's provider copies, and its retention says to."""
    return isinstance(executor, DiscardableBatch) and executor.retention == Retention.DELETE


def discard_collected(
    store: Store, job: str, shard_id: str, attempt: int, handle: BatchHandle, executor: object
) -> list[str] | None:
    """Delete what one collected attempt left at the provider, then record ``discarded`` (``{"deleted": [...]}``).

    Returns what was deleted; None when nothing was done: retention ``keep``, an executor that cannot delete, an
    attempt not collected yet or already discarded, or a delete that failed (logged; the sweep tries again).
    """
    if not deletes(executor):
        return None
    assert isinstance(executor, DiscardableBatch)
    attempts = AttemptLog(store, job, shard_id)
    events = attempts.events(attempt)
    if "collected" not in events or DISCARDED in events:  # results not stored yet, or done already
        return None
    try:
        deleted = executor.discard(handle)
    except BatchPipelineError as exc:
        log.warning(
            "shard %s attempt %d: could not delete batch %s's files at the provider (%s: %s); the publish "
            "run's sweep tries again",
            shard_id,
            attempt,
            handle.batch_id,
            type(exc).__name__,
            exc,
        )
        return None
    attempts.record_once(
        attempt, DISCARDED, {"backend": handle.backend, "batch_id": handle.batch_id, "deleted": deleted}
    )
    log.info(
        "shard %s attempt %d: deleted %d provider copies of batch %s", shard_id, attempt, len(deleted), handle.batch_id
    )
    return deleted


def left_at_provider(attempt: Attempt) -> bool:
    """A provider batch whose results are stored and whose copies were not deleted (yet)."""
    return attempt.submitted is not None and attempt.collected is not None and attempt.discarded is None


def leftovers(spec: JobSpec, store: Store) -> Iterator[tuple[str, Attempt]]:
    """Every (shard, attempt) of the job whose copies may still be at the provider; reads the attempt logs only."""
    for shard_id in Manifest(spec.name, store).shard_ids():
        for attempt in AttemptLog(store, spec.name, shard_id).all(request_ids=False):
            if left_at_provider(attempt):
                yield shard_id, attempt


@dataclass
class SweepOutcome:
    discarded: int = 0  # attempts whose copies were deleted now
    deleted: list[str] = field(default_factory=list)  # what was deleted (ids, URIs)
    kept: int = 0  # attempts left as they are: retention keep
    failed: list[str] = field(default_factory=list)  # why an attempt could not be cleaned (tried again next time)

    def describe(self) -> str:
        parts = [f"deleted the provider copies of {self.discarded} attempt(s) ({len(self.deleted)} objects)"]
        if self.kept:
            parts.append(f"{self.kept} kept (retention: keep)")
        if self.failed:
            parts.append(f"{len(self.failed)} failed and are tried again at the next publish: {self.failed[0]}")
        return "; ".join(parts)


class _Executors:
    """The executor of each backend a handle names, built once; a backend that cannot be built gives its error."""

    def __init__(self, executor_for: Callable[[str], Any]) -> None:
        self.make, self.built = executor_for, {}

    def of(self, backend: str) -> Any:
        if backend not in self.built:
            try:
                self.built[backend] = self.make(backend)
            except BatchPipelineError as exc:
                self.built[backend] = exc
        return self.built[backend]


def sweep_due(spec: JobSpec, store: Store, executor_for: Callable[[str], Any]) -> bool:
    """Some provider copies a killed run left that ``sweep_leftovers`` would delete (an executor that deletes)."""
    executors = _Executors(executor_for)
    return any(
        attempt.submitted is not None and deletes(executors.of(attempt.submitted.handle().backend))
        for _, attempt in leftovers(spec, store)
    )


def sweep_leftovers(spec: JobSpec, store: Store, executor_for: Callable[[str], Any]) -> SweepOutcome:
    """Discard every collected attempt of the job that has no ``discarded`` record (a run killed between storing
    and deleting, a delete that failed). ``executor_for(backend name)`` builds the executor a handle names (None:
    a backend the job no longer has). Nothing here raises for a provider failure: publishing goes on."""
    outcome = SweepOutcome()
    executors = _Executors(executor_for)
    for shard_id, attempt in leftovers(spec, store):
        assert attempt.submitted is not None  # leftovers: submitted attempts only
        handle = attempt.submitted.handle()
        executor = executors.of(handle.backend)
        if isinstance(executor, BatchPipelineError) or executor is None:
            outcome.failed.append(
                f"shard {shard_id} attempt {attempt.number}: no {handle.backend} executor"
                + (f" ({executor})" if executor is not None else "")
            )
            continue
        if not deletes(executor):
            outcome.kept += int(isinstance(executor, DiscardableBatch))
            continue
        deleted = discard_collected(store, spec.name, shard_id, attempt.number, handle, executor)
        if deleted is None:
            if DISCARDED not in AttemptLog(store, spec.name, shard_id).events(attempt.number):  # not a racing run
                outcome.failed.append(f"shard {shard_id} attempt {attempt.number}: batch {handle.batch_id}")
            continue
        outcome.discarded += 1
        outcome.deleted += deleted
    if outcome.discarded or outcome.failed:
        log.info("job %s: %s", spec.name, outcome.describe())
    return outcome
