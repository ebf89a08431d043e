"""A publish run scans the job once: its results step reads the JobState after its sweep, and what runs after it in
the same run (the blocking checks, dead_letters, report) takes that scan; a second publish run scans again, and
nothing is kept after either."""

import pyarrow.parquet as pq

from batch_pipeline.core.publish import tables
from batch_pipeline.core.settings import Settings
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline.defs import run_state
from batch_pipeline.defs.jobs import PUBLISH_ASSETS
from batch_pipeline.defs.pipeline import PassLoop, run_job


def test_a_publish_run_scans_the_job_once(sandbox, make_job, instance, resources, home, monkeypatch):
    spec = make_job()
    scans: list[str] = []
    real = tables.scan_job
    monkeypatch.setattr(tables, "scan_job", lambda spec, store: scans.append(spec.name) or real(spec, store))
    report = run_job(spec, instance, resources)
    assert report["complete"] and len(scans) == 1
    assert run_state._RUN_STATE == {}  # let go by the report

    store = Store(home)
    dead = pq.read_table(store.local_path(JobPaths(spec.name).dead_letters))
    scans.clear()
    loop = PassLoop(spec, instance, resources, Settings(), 50, "WARNING", lambda s: None)
    loop.materialize(PUBLISH_ASSETS)  # published again: a run of its own scans anew, once
    assert len(scans) == 1 and run_state._RUN_STATE == {}
    assert pq.read_table(store.local_path(JobPaths(spec.name).dead_letters)).equals(dead)
