"""A run with nothing to do, told apart before any Dagster machinery starts: ``batch-pipeline run`` of a finished job.

``run`` lifts a stop, a pause and held shards, waits on open batches and on room in a full account queue: none of
those is a run with nothing to do. What is: no stop, pause or hold to lift, no input file the manifest would read
(every current file as the latest generation left it, none gone), every shard settled (the driver's plan is
PUBLISH), no provider copy left for the publish's sweep, and the last publish still standing
(``current.standing``: the same spec, inputs, summaries and record files). Then the run reads its report and
prints it; it reads no item and no result, makes no manifest generation and starts no Dagster run. Anything in
doubt (a later pass, ``input.from_job``, whose input is another job's table; a price table newer than the backend
comparison a ``cost_compare`` job makes with its manifest) takes the ordinary run.
"""

from pathlib import Path

from batch_pipeline.core.errors import BatchPipelineError
from batch_pipeline.core.ledger.attempts import AttemptLog
from batch_pipeline.core.ledger.control import JobControl
from batch_pipeline.core.manifest.incremental import FileAction, plan_files
from batch_pipeline.core.manifest.read import Manifest
from batch_pipeline.core.manifest.upstream import job_inputs
from batch_pipeline.core.publish.current import PublishBasis, standing
from batch_pipeline.core.run.hygiene import left_at_provider
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.state.view import load_view
from batch_pipeline.core.store import Store


def inputs_unchanged(spec: JobSpec, store: Store) -> bool:
    """No input file would be read: every current file is as the latest generation left it (size and mtime, the
    manifest's own test) and none it knows is gone. False for a later pass (``input.from_job``)."""
    if spec.input.from_job is not None:
        return False
    manifest = Manifest(spec.name, store)
    latest = manifest.latest()
    if latest is None:
        return False
    prior = manifest.file_states(latest)
    try:
        files = job_inputs(spec, store)
    except (BatchPipelineError, OSError):  # the ordinary run says what is wrong with the input
        return False
    if {f.uri for f in files} != set(prior):
        return False
    return all(p.action is FileAction.SKIPPED for p in plan_files(files, prior))


def _sweep_may_be_due(spec: JobSpec, store: Store, shard_ids: list[str]) -> bool:
    """A collected attempt whose provider copies were not deleted, on a job whose backends delete them (the
    default retention): the publish run's sweep would try again."""
    keeps = all(str(b.settings.get("retention", "delete")) == "keep" for b in spec.sending_backends().values())
    if keeps:
        return False
    return any(
        left_at_provider(a)
        for shard_id in shard_ids
        for a in AttemptLog(store, spec.name, shard_id).all(request_ids=False)
    )


def _comparison_current(spec: JobSpec, store: Store, prices: Path | None) -> bool:
    """A ``cost_compare`` job's backend comparison (made with every manifest) is newer than the price table."""
    if spec.cost_compare is None:
        return True
    made = store.mtime_ns(f"{JobPaths(spec.name).root}/backend_comparison.json")
    if made is None or prices is None:
        return False
    try:
        return made > prices.stat().st_mtime_ns
    except OSError:
        return False


def nothing_to_do(spec: JobSpec, store: Store, prices: Path | None = None) -> dict | None:
    """The last publish's report when a run of the job would do nothing (the module's docstring), else None."""
    control = JobControl(store, spec.name)
    if control.current() is not None or control.paused() is not None or control.shard_holds():
        return None
    if not inputs_unchanged(spec, store) or not _comparison_current(spec, store, prices):
        return None
    view = load_view(spec, store, waits_inline=True)  # the pass loop's first plan (nothing is submitted here)
    if not view.plan().publish:
        return None
    if _sweep_may_be_due(spec, store, [s.shard_id for s in view.summaries]):
        return None
    report = standing(spec, store, PublishBasis.of(spec, store, view.summaries), new_generation=False)
    if report is None:
        return None
    return {**report, "new_input_rows": 0}  # this run read no row
