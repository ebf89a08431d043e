"""Sensors through build_sensor_context: new data -> manifest run -> shard runs (submit, collect) -> publish."""

import shutil
import time

import dagster as dg

from batch_pipeline.core.ledger.control import JobControl
from batch_pipeline.core.settings import Settings
from batch_pipeline.core.store import Store
from batch_pipeline.defs.assets import SHARDS_TAG, asset_key
from batch_pipeline.defs.build import build_definitions
from batch_pipeline.defs.jobs import PUBLISH_ASSETS, build_jobs
from batch_pipeline.defs.sensors import RANGE_END, RANGE_START, build_new_data_sensor, build_shard_sensor

from .conftest import SMALL, ledger_ids

STAGE_ASSETS = {
    "prepare": ["manifest", "quote"],
    "quote": ["quote"],
    "submit": ["submissions"],
    "collect": ["shard_results"],
    "publish": PUBLISH_ASSETS,
}


def _requests(result) -> list[dg.RunRequest]:
    if isinstance(result, dg.SkipReason):
        return []
    return [result] if isinstance(result, dg.RunRequest) else list(result or [])


def _execute(spec, instance, resources, request: dg.RunRequest, default_stage: str) -> None:
    """Run what a sensor asked for, in-process, as the daemon would (same assets, same partition)."""
    stage = (request.job_name or f"{spec.name}_{default_stage}").removeprefix(f"{spec.name}_")
    tags = dict(request.tags)
    if request.run_key:  # the daemon skips a request whose run key its sensor already ran: so must the test, loudly
        by = {"dagster/run_key": request.run_key, "test/run_job": request.job_name or default_stage}
        assert not instance.get_runs(dg.RunsFilter(tags=by), limit=1), (
            f"run key {request.run_key} was asked for again: the daemon would skip it as done"
        )
        tags.update(by)
    defs = build_definitions([spec], resources)
    dg.materialize(
        [*defs.assets, *defs.asset_checks],
        selection=[asset_key(spec, n) for n in STAGE_ASSETS[stage]],
        partition_key=request.partition_key,
        instance=instance,
        resources=defs.resources,
        tags=tags,
    )


def test_new_data_sensor_fires_once_per_change(make_job, instance, tmp_path):
    spec = make_job()
    sensor = build_new_data_sensor(spec, build_jobs(spec))
    ctx = dg.build_sensor_context(instance=instance)
    first = _requests(sensor(ctx))
    assert len(first) == 1 and first[0].run_key.startswith("prepare:")
    ctx = dg.build_sensor_context(instance=instance, cursor=ctx.cursor)
    assert _requests(sensor(ctx)) == []
    shutil.copy(SMALL, tmp_path / "data" / "in" / "more.jsonl")  # a dropped file
    again = _requests(sensor(dg.build_sensor_context(instance=instance, cursor=ctx.cursor)))
    assert len(again) == 1 and again[0].run_key != first[0].run_key


def moved(request: dg.RunRequest) -> list[str]:
    """The shards a run request moves: its partition, or the shards its range names."""
    return [request.partition_key] if request.partition_key else request.tags[SHARDS_TAG].split(",")


def test_dropped_file_drives_manifest_then_shards_then_publish(sandbox, make_job, instance, resources, home, tmp_path):
    spec = make_job()
    jobs = build_jobs(spec)
    new_data, driver = build_new_data_sensor(spec, jobs), build_shard_sensor(spec, jobs)
    store = Store(home)
    runs: list[dg.RunRequest] = []

    def tick_driver():
        return _requests(driver(dg.build_sensor_context(instance=instance, resources=resources)))

    def run(request: dg.RunRequest, stage: str) -> None:
        runs.append(request)
        _execute(spec, instance, resources, request, stage)

    def tick_and_run_collects(expected: int) -> list[str]:
        collects: list[dg.RunRequest] = []
        for _ in range(100):  # until the provider has ended every batch (a daemon's tick comes every 30 s)
            collects = tick_driver()
            if sum(len(moved(r)) for r in collects) == expected:
                break
            time.sleep(0.1)
        assert {r.job_name for r in collects} == {f"{spec.name}_collect"}
        for r in collects:
            run(r, "collect")
        return sorted(s for r in collects for s in moved(r))

    # before any manifest, the driver starts nothing
    assert tick_driver() == []
    # a prepare run in flight holds every shard back
    [prepare] = _requests(new_data(dg.build_sensor_context(instance=instance)))
    run_ = instance.add_run(
        dg.DagsterRun(job_name=f"{spec.name}_prepare", run_id="f" * 36, status=dg.DagsterRunStatus.STARTED)
    )
    run(prepare, "prepare")
    assert tick_driver() == [], "shards must wait while a manifest run is in flight"
    instance.report_run_canceled(run_)
    # the canary shard goes first, alone; the others wait until it has settled
    [canary] = tick_driver()
    assert canary.partition_key == "s00001" and canary.job_name == f"{spec.name}_submit"
    assert canary.run_key == "canary:s00001:1"
    run(canary, "submit")
    assert tick_and_run_collects(expected=1) == ["s00001"]
    # the other three shards: one run over their partition range
    [submit] = tick_driver()
    assert submit.job_name == f"{spec.name}_submit" and submit.partition_key is None
    assert (submit.tags[RANGE_START], submit.tags[RANGE_END], moved(submit)) == (
        "s00002",
        "s00004",
        ["s00002", "s00003", "s00004"],
    )
    assert submit.run_key.startswith("submit:s00002..s00004:")
    run(submit, "submit")
    # batches end at the provider; the driver asks for collection runs, never a second submission
    assert tick_and_run_collects(expected=3) == ["s00002", "s00003", "s00004"]
    [publish] = tick_driver()
    assert publish.job_name == f"{spec.name}_publish"
    run(publish, "publish")
    report = store.read_json(f"jobs/{spec.name}/report.json")
    assert report["complete"] and report["succeeded"] == 40
    assert sorted(set(ledger_ids(sandbox))) == sorted(ledger_ids(sandbox)) and len(ledger_ids(sandbox)) == 40
    # 4 shards: prepare, canary submit + collect, one ranged submit, one ranged collect, publish (was 10 runs)
    assert len(runs) == 6, [
        (r.job_name, moved(r) if r.job_name.endswith(("_submit", "_collect")) else "") for r in runs
    ]


def test_driver_skips_a_stopped_job_and_resubmits_retryable_shards(
    sandbox, make_job, instance, resources, home, monkeypatch
):
    spec = make_job()
    jobs = build_jobs(spec)
    driver = build_shard_sensor(spec, jobs)
    _execute(spec, instance, resources, dg.RunRequest(), "prepare")
    store = Store(home)
    JobControl(store, spec.name).stop("bad key", code="invalid_api_key")
    result = driver(dg.build_sensor_context(instance=instance, resources=resources))
    assert isinstance(result, dg.SkipReason) and "stopped" in result.skip_message
    JobControl(store, spec.name).clear()
    sandbox.set_scenario("line_errors", rate=0.5, times=1)
    first = _requests(driver(dg.build_sensor_context(instance=instance, resources=resources)))
    _execute(spec, instance, resources, next(r for r in first if r.partition_key == "s00001"), "submit")
    for _ in range(100):
        collect = [
            r
            for r in _requests(driver(dg.build_sensor_context(instance=instance, resources=resources)))
            if r.partition_key == "s00001" and r.job_name.endswith("_collect")
        ]
        if collect:
            break
        time.sleep(0.1)
    _execute(spec, instance, resources, collect[0], "collect")
    # the retryable canary shard and the three new ones: one range, keyed by each shard's next attempt
    [again] = _requests(driver(dg.build_sensor_context(instance=instance, resources=resources)))
    assert again.job_name.endswith("_submit") and moved(again) == ["s00001", "s00002", "s00003", "s00004"]
    one_per_run = build_shard_sensor(spec, jobs, Settings(shards_per_run=1))  # the per-shard key
    again = [  # says the attempt
        r
        for r in _requests(one_per_run(dg.build_sensor_context(instance=instance, resources=resources)))
        if r.partition_key == "s00001"
    ]
    assert len(again) == 1 and again[0].job_name.endswith("_submit") and again[0].run_key == "submit:s00001:2"


def test_driver_requotes_before_submitting_when_the_quote_expired(sandbox, make_job, instance, resources, home):
    spec = make_job()
    driver = build_shard_sensor(spec, build_jobs(spec))
    _execute(spec, instance, resources, dg.RunRequest(), "prepare")
    store = Store(home)
    quote = store.read_json(f"jobs/{spec.name}/quote.json")
    store.write_json(f"jobs/{spec.name}/quote.json", {**quote, "expires_at": "2026-01-01T00:00:00+00:00"})
    [request] = _requests(driver(dg.build_sensor_context(instance=instance, resources=resources)))
    assert request.job_name == f"{spec.name}_quote"
    _execute(spec, instance, resources, request, "quote")
    [submit] = _requests(driver(dg.build_sensor_context(instance=instance, resources=resources)))
    assert submit.job_name == f"{spec.name}_submit" and submit.partition_key == "s00001"
