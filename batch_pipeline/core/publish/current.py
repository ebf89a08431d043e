"""Whether the job's last publish still stands: a run with nothing new to publish skips the publish run.

A publish reads the spec, the manifest's live rows (its input files as the manifest last saw them) and every result
and attempt record; every record write refreshes its shard's summary. So a publish whose spec, input files, shard
summaries and record files (the result parts and attempt records as listed: path, size, mtime; a part written
behind the summaries' back, which the publish's reconciliation check would catch, changes them) are all what they
are now would write the same tables again. ``PublishBasis`` is that fingerprint: the
pass loop records it beside the report once a publish succeeded (``record``), and before the next publish asks
``standing`` whether it still holds; when it does the run keeps the published tables (reading no item or result)
and only brings the report's manifest figures (``manifest_generation``, ``new_input_rows``) up to this run's
manifest generation, which read nothing new.
"""

import hashlib
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace

from batch_pipeline.core.manifest.read import Manifest
from batch_pipeline.core.run.summary import ShardSummary
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store

BASIS_VERSION = 1
# what a file's state says of its identity (the action, how it was read this time, is not part of it)
_NOT_IDENTITY = ("action",)


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


@dataclass(frozen=True)
class PublishBasis:
    """What a publish was made from, as digests: the spec, the input files the manifest knows, the summaries and the
    listing of the record files."""

    spec: str
    inputs: str
    summaries: str
    records: str
    generation: int  # the manifest generation the publish was made from (the report's ``manifest_generation``)
    version: int = BASIS_VERSION

    @classmethod
    def of(cls, spec: JobSpec, store: Store, summaries: Iterable[ShardSummary]) -> "PublishBasis":
        """The basis as the store has it now (``summaries``: every shard's, as the plan read them)."""
        latest, paths = Manifest(spec.name, store).latest(), JobPaths(spec.name)
        files = [
            {k: v for k, v in f.as_dict().items() if k not in _NOT_IDENTITY} for f in (latest.files if latest else [])
        ]
        return cls(
            spec=_digest(json.loads(spec.model_dump_json())),
            inputs=_digest(sorted(files, key=lambda f: str(f.get("uri")))),
            summaries=_digest([s.as_dict() for s in summaries]),
            records=_digest([store.file_stats(d) for d in (paths.results, f"{paths.root}/attempts")]),
            generation=latest.generation if latest else 0,
        )

    def same_work(self, other: "PublishBasis") -> bool:
        """The same spec, inputs and summaries (the generation may have moved on: a run that read nothing new)."""
        return replace(self, generation=other.generation) == other


def _path(job: str) -> str:
    return f"{JobPaths(job).root}/publish_basis.json"


def record(store: Store, job: str, basis: PublishBasis) -> None:
    """After a publish succeeded: what it was made from."""
    store.write_json(_path(job), asdict(basis))


def recorded(store: Store, job: str) -> PublishBasis | None:
    raw = store.read_json(_path(job))
    if not raw or raw.get("version") != BASIS_VERSION:
        return None
    try:
        return PublishBasis(**raw)
    except TypeError:  # a basis of another shape: publish again
        return None


def standing(spec: JobSpec, store: Store, now: PublishBasis, *, new_generation: bool = True) -> dict | None:
    """The last publish's report when it still stands for ``now`` (the same work, its report made from the recorded
    generation, its tables in place), else None: publish. ``new_generation``: this run's manifest made ``now``'s
    generation, which must have read no row; False: no manifest ran since the publish (its generation is ``now``'s).
    """
    last = recorded(store, spec.name)
    if last is None or not now.same_work(last):
        return None
    paths = JobPaths(spec.name)
    report = store.read_json(paths.report) or {}
    if report.get("manifest_generation") != last.generation or not report.get("published_at"):
        return None
    if not all(store.exists(p) for p in (paths.validated, paths.dead_letters)):
        return None
    if not new_generation:
        return report if now.generation == last.generation else None
    latest = Manifest(spec.name, store).latest()
    if latest is None or latest.generation != now.generation or latest.input_rows or latest.new_requests:
        return None
    return report


def carry_forward(spec: JobSpec, store: Store, report: dict, now: PublishBasis) -> dict:
    """The standing report brought up to this run's manifest generation (which read nothing new), stored, and the
    basis moved with it; everything the publish computed stays as it was."""
    latest = Manifest(spec.name, store).latest()
    report = {**report, "manifest_generation": now.generation, "new_input_rows": latest.input_rows if latest else 0}
    store.write_json(JobPaths(spec.name).report, report)
    record(store, spec.name, now)
    return report
