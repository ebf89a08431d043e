"""Progress that scales: the CLI's pass loop opens a bar per step, the range runs' assets count towards it, and
each run's share is in its asset metadata."""

from datetime import UTC, datetime, timedelta
from pathlib import Path

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
    # the manifest's bar had a real total: the bytes of the input it read, all of them, and the rows beside them
    [read] = [f for f in sink.closed if f.task == "manifest"]
    size = sum(p.stat().st_size for p in Path(spec.input.path).parent.glob("*.jsonl"))
    assert (read.unit, read.done, read.total) == ("bytes", size, size) and read.note == "40 rows", read
    meta = instance.fetch_materializations(asset_key(spec, "submissions"), limit=1).records[0]
    figures = meta.asset_materialization.metadata
    assert figures["progress_shards"] == dg.MetadataValue.int(1)  # the last range run moved one shard (s00004)
    assert figures["progress_shards_per_s"].value > 0 and "progress_elapsed_s" in figures


def test_a_run_with_nothing_new_shows_no_bar_and_each_pass_says_what_it_did(sandbox, make_job, instance, resources):
    spec = make_job()
    stages: list[str] = []
    run_job(spec, instance, resources, on_stage=stages.append)
    # what each step did, in counts that add up (the canary's batch, then the other 3 shards')
    assert "canary done: 1 batch(es) sent, 1 collected" in stages, stages
    assert "pass 1 done: 3 batch(es) sent, 3 collected" in stages, stages
    sink = Recorder()
    stages.clear()
    with progress.reporting(sink):
        report = run_job(spec, instance, resources, on_stage=stages.append)  # a resume with nothing new
    assert report["complete"] and report["passes"] == 0
    assert sink.shown == set() and sink.closed == [], (sink.shown, sink.closed)  # no "0/0 0.0 rows/s" bar
    # nothing changed since the publish: its tables stand (core/publish/current.py), no publish run
    assert stages[0] == "manifest" and len(stages) == 2, stages
    assert stages[1].startswith("publish: nothing changed since the publish at "), stages


def test_a_pass_names_the_online_rescue_its_plan_did_not_say(sandbox, make_job, instance, resources):
    tail = {"backend": {"name": "online", "settings": {"sandbox": True, "concurrency": 4}}}
    spec = make_job(deadline=(datetime.now(UTC) + timedelta(hours=6)).isoformat(), tail=tail, canary_first=False)
    sandbox.set_scenario("expire", complete_share=0.5)  # every batch expires half done: the rest goes online
    stages: list[str] = []
    assert run_job(spec, instance, resources, on_stage=stages.append)["complete"]
    planned = next(s for s in stages if s.startswith("pass 1:"))
    assert planned.endswith("planned: submit 4") and "rescue" not in planned, stages
    done = next(s for s in stages if s.startswith("pass 1 done:"))
    assert done.startswith("pass 1 done: 4 batch(es) sent, 4 collected; 4 shard run(s) rescued on online ("), done
