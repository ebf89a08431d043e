"""Progress that scales: the CLI's pass loop opens a bar per step, the range runs' assets count towards it, and
each run's share is in its asset metadata."""

import dagster as dg

from batch_pipeline.core import progress
from batch_pipeline.defs.assets import asset_key
from batch_pipeline.defs.pipeline import run_job


class Recorder:
    """A sink that keeps the final figures of each whole it saw closed, and every task it was shown."""

    def __init__(self) -> None:
        self.closed: list[progress.Figures] = []
        self.shown: set[str] = set()

    def update(self, meter: progress.Meter) -> None:
        self.shown.add(meter.task)

    def close(self, meter: progress.Meter) -> None:
        self.closed.append(meter.figures())


def test_the_pass_loop_shows_submission_and_collection_per_shard(sandbox, make_job, instance, resources):
    spec = make_job()  # 4 shards: the canary alone, then one pass over the other 3
    sink = Recorder()
    with progress.reporting(sink):
        report = run_job(spec, instance, resources, shards_per_run=2)  # 2 range runs in the pass
    assert report["complete"]
    whole = {f.task: f for f in sink.closed if f.task in ("submit", "collect")}
    for task in ("submit", "collect"):
        assert (whole[task].done, whole[task].total, whole[task].unit) == (3, 3, "shards"), sink.closed
        assert whole[task].rate_per_s > 0
    assert {"manifest", "submit", "collect"} <= sink.shown
    meta = instance.fetch_materializations(asset_key(spec, "submissions"), limit=1).records[0]
    figures = meta.asset_materialization.metadata
    assert figures["progress_shards"] == dg.MetadataValue.int(1)  # the last range run moved one shard (s00004)
    assert figures["progress_shards_per_s"].value > 0 and "progress_elapsed_s" in figures
