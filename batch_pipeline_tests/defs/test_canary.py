"""The canary gate: a canary that fails its golden threshold blocks every other shard; a passing one lets them run."""

import dagster as dg
import polars as pl
import pytest

from batch_pipeline.core.ledger.control import JobControl
from batch_pipeline.core.publish.tables import JobState
from batch_pipeline.core.quality.golden import canary_passed, probe_accuracy
from batch_pipeline.core.store import Store
from batch_pipeline.defs.assets import asset_key
from batch_pipeline.defs.build import build_definitions
from batch_pipeline.defs.pipeline import run_job

from .conftest import REPO, batch_creates

QUALITY = {
    "golden": str(REPO / "data" / "golden" / "demo.jsonl"),
    "canary_min_accuracy": 0.85,
    "golden_share": 0.1,
    "eval_backend": {"name": "online", "settings": {"sandbox": True}},
}


def test_a_failing_canary_blocks_every_other_shard(sandbox, make_job, instance, resources, home):
    spec = make_job(quality=QUALITY)
    sandbox.set_scenario("wrong_labels", share=1.0)  # the model answers golden items wrongly
    with pytest.raises(dg.Failure, match="canary shard s00001 failed: golden accuracy"):
        run_job(spec, instance, resources)
    assert batch_creates(sandbox) == 1  # only the canary went out
    store = Store(home)
    assert JobControl(store, spec.name).current().code == "canary_failed"
    verdict = canary_passed(spec, store)
    assert verdict.passed is False and verdict.probes == 60 and verdict.accuracy < 0.5
    # a run started separately (a sensor, a user) for another shard is refused by the shard asset itself
    JobControl(store, spec.name).clear()
    defs = build_definitions([spec], resources)
    result = dg.materialize(
        [*defs.assets, *defs.asset_checks],
        selection=[asset_key(spec, "submissions")],
        partition_key="s00002",
        instance=instance,
        resources=defs.resources,
        raise_on_error=False,
    )
    assert not result.success and batch_creates(sandbox) == 1
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert "waits for the canary shard s00001" in failure.step_failure_data.user_failure_data.description


def test_a_passing_canary_lets_the_job_run_and_every_shard_reports_its_accuracy(
    sandbox, make_job, instance, resources, home
):
    spec = make_job(quality=QUALITY)
    report = run_job(spec, instance, resources)
    assert report["complete"] and report["succeeded"] == 40
    store = Store(home)
    assert canary_passed(spec, store).passed is True
    state = JobState.load(spec, store)
    per_shard = probe_accuracy(
        state.probe_results,
        pl.concat([pl.read_parquet(store.read_bytes(p)) for p in store.list_files(f"jobs/{spec.name}/golden/probes")]),
    )
    assert per_shard["shard_id"].to_list() == ["s00001", "s00002", "s00003", "s00004"]
    assert per_shard.filter(pl.col("shard_id") == "s00001")["probes"][0] == 60
    assert per_shard.filter(pl.col("shard_id") != "s00001")["probes"].to_list() == [1, 1, 1]
    # probes are paid requests but not items: reconciliation is about the 40 items only
    assert state.check().expected == 40
