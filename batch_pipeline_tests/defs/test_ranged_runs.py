"""The shard sensor's partition-range runs: what a range moves, what it holds, a failed range, the per-tick bound."""

import time
import uuid

import dagster as dg

from batch_pipeline.core.ledger.machine import ShardState
from batch_pipeline.core.settings import Settings
from batch_pipeline.core.state.turns import TurnLimits
from batch_pipeline.core.state.view import load_view
from batch_pipeline.core.store import Store
from batch_pipeline.defs.assets import SHARDS_TAG
from batch_pipeline.defs.jobs import build_jobs
from batch_pipeline.defs.sensors import RANGE_END, RANGE_START, STEP_TAG, build_shard_sensor

from .conftest import batch_creates
from .test_sensors import _execute, _requests, moved

MAX_RUNS_PER_TICK = TurnLimits.runs_per_tick


def _tick(driver, instance, resources) -> list[dg.RunRequest]:
    return _requests(driver(dg.build_sensor_context(instance=instance, resources=resources)))


def _past_the_canary(spec, instance, resources):
    """Prepare, then the canary shard submitted and collected: the other shards are ready to submit."""
    driver = build_shard_sensor(spec, build_jobs(spec))
    _execute(spec, instance, resources, dg.RunRequest(), "prepare")
    [canary] = _tick(driver, instance, resources)
    _execute(spec, instance, resources, canary, "submit")
    for _ in range(100):
        collects = _tick(driver, instance, resources)
        if collects:
            break
        time.sleep(0.1)
    [collect] = collects
    _execute(spec, instance, resources, collect, "collect")
    return driver


def _add_run(instance, job_name: str, status: dg.DagsterRunStatus, tags: dict[str, str]) -> dg.DagsterRun:
    return instance.add_run(dg.DagsterRun(job_name=job_name, run_id=str(uuid.uuid4()), status=status, tags=tags))


def test_a_range_run_moves_only_the_shards_it_names(sandbox, make_job, instance, resources, home):
    spec = make_job()
    _past_the_canary(spec, instance, resources)
    assert batch_creates(sandbox) == 1  # the canary's
    request = dg.RunRequest(
        job_name=f"{spec.name}_submit", tags={RANGE_START: "s00002", RANGE_END: "s00004", SHARDS_TAG: "s00002,s00004"}
    )
    _execute(spec, instance, resources, request, "submit")
    states = load_view(spec, Store(home)).plan().states
    assert states["s00002"] == states["s00004"] == ShardState.SUBMITTED
    assert states["s00003"] == ShardState.NEW  # inside the range, not named: left to its own step
    assert batch_creates(sandbox) == 3  # one batch per shard moved


def test_a_range_in_flight_holds_the_shards_it_moves_not_those_it_steps_over(sandbox, make_job, instance, resources):
    spec = make_job()
    driver = _past_the_canary(spec, instance, resources)
    _add_run(
        instance,
        f"{spec.name}_submit",
        dg.DagsterRunStatus.STARTED,
        {RANGE_START: "s00002", RANGE_END: "s00004", SHARDS_TAG: "s00002,s00004"},
    )
    [request] = _tick(driver, instance, resources)
    assert request.partition_key == "s00003" and request.run_key == "submit:s00003:1"


def test_a_failed_range_is_asked_again_shard_by_shard_and_a_shard_that_keeps_failing_waits(
    sandbox, make_job, instance, resources
):
    spec = make_job()
    driver = _past_the_canary(spec, instance, resources)
    submit = f"{spec.name}_submit"
    [ranged] = _tick(driver, instance, resources)
    assert moved(ranged) == ["s00002", "s00003", "s00004"] and ranged.partition_key is None
    assert _tick(driver, instance, resources)[0].run_key == ranged.run_key  # the same plan, the same key
    _add_run(instance, submit, dg.DagsterRunStatus.FAILURE, {**ranged.tags, "dagster/run_key": ranged.run_key})
    singles = _tick(driver, instance, resources)
    assert [(r.partition_key, r.run_key) for r in singles] == [(s, f"submit:{s}:1") for s in moved(ranged)]
    assert all(r.tags[STEP_TAG] == f"{submit}/{r.run_key}" for r in singles)
    for n in range(3):  # s00003 fails alone three times: the others go on, it waits for a human
        key = "submit:s00003:1" + (f":r{n}" if n else "")
        _add_run(
            instance,
            submit,
            dg.DagsterRunStatus.FAILURE,
            {"dagster/partition": "s00003", "dagster/run_key": key, STEP_TAG: f"{submit}/submit:s00003:1"},
        )
    # s00002's run ended well without sending (another job took the queue's room first): asked again, a new key
    _add_run(
        instance,
        submit,
        dg.DagsterRunStatus.SUCCESS,
        {"dagster/partition": "s00002", "dagster/run_key": "submit:s00002:1", STEP_TAG: f"{submit}/submit:s00002:1"},
    )
    again = _tick(driver, instance, resources)
    assert [(r.partition_key, r.run_key) for r in again] == [
        ("s00002", "submit:s00002:1:r1"),
        ("s00004", "submit:s00004:1"),
    ]
    for shard in ("s00002", "s00004"):  # once those run, nothing moves, and the tick says why s00003 waits
        _add_run(instance, submit, dg.DagsterRunStatus.STARTED, {"dagster/partition": shard})
    skipped = driver(dg.build_sensor_context(instance=instance, resources=resources))
    assert isinstance(skipped, dg.SkipReason) and "s00003 failed 3 runs in a row" in skipped.skip_message


def test_runs_per_tick_are_bounded(make_job, instance, resources, monkeypatch):
    rows = [
        {"ticket_id": f"t{i}", "subject": f"subject {i}", "body": f"ticket number {i} cannot log in"}
        for i in range(MAX_RUNS_PER_TICK + 5)
    ]
    spec = make_job(rows=rows, shards={"max_requests": 1}, canary_first=False)
    jobs = build_jobs(spec)
    _execute(spec, instance, resources, dg.RunRequest(), "prepare")
    one_per_run = build_shard_sensor(spec, jobs, Settings(shards_per_run=1))
    requests = _tick(one_per_run, instance, resources)
    assert len(requests) == MAX_RUNS_PER_TICK and all(r.partition_key for r in requests)
    [ranged] = _tick(build_shard_sensor(spec, jobs, Settings(shards_per_run=50)), instance, resources)
    assert len(moved(ranged)) == MAX_RUNS_PER_TICK + 5
