"""The fault campaign: a real `batch-pipeline run` is SIGKILLed at each named boundary, then finished, by the CLI
or by the sensors. From the sandbox's ledger: nothing is billed twice across batch and online, every item is
accounted for, and the validated table equals a clean run's.

The kill is real (``BATCH_PIPELINE_CRASH_AT`` makes the process SIGKILL itself at that point; see
``core/run/faults.py``): nothing is flushed, no lease released, no finally block runs.
"""

import os
import signal
import subprocess
from collections import Counter
from datetime import UTC, datetime, timedelta

import dagster as dg
import polars as pl
import pytest

from batch_pipeline.core.publish.tables import JobState
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline.defs.assets import asset_key
from batch_pipeline.defs.build import build_definitions
from batch_pipeline.defs.jobs import PUBLISH_ASSETS, build_jobs
from batch_pipeline.defs.pipeline import run_job
from batch_pipeline.defs.sensors import build_shard_sensor
from batch_pipeline_tests.cli_forks import CliForks

TAIL = {
    "backend": {"name": "online", "settings": {"sandbox": True, "concurrency": 2, "flush_every": 3}},
    "before_deadline_minutes": 60,
}
ONLINE = {"name": "online", "settings": {"sandbox": True, "concurrency": 2, "flush_every": 3}}
SHAPES = {
    "batch": {},
    "online": {"backend": ONLINE},
    "rescue": {"tail": TAIL},  # the deadline is set near at run time: every shard goes through the rescue path
}
# (crash point, job shape): every boundary where a process can die with money in flight
CASES = [
    ("after_intent", "batch"),
    ("after_create", "batch"),
    ("mid_collect", "batch"),
    ("before_collected", "batch"),
    ("after_collected", "batch"),
    ("after_intent", "online"),
    ("mid_stream", "online"),
    ("mid_rescue", "rescue"),
]
# finished by the CLI, and the batch cases also by the sensors (stream shards run inline in either)
RUNS = [(p, s, "cli") for p, s in CASES] + [(p, s, "sensors") for p, s in CASES if s == "batch"]
_reference: dict[str, pl.DataFrame] = {}


def _spec(make_job, shape: str):
    overrides = dict(SHAPES[shape])
    if shape == "rescue":
        overrides["deadline"] = (datetime.now(UTC) + timedelta(minutes=20)).isoformat()
    return make_job(canary={"size": 4}, **overrides)


def _cli(cli: CliForks, spec, home, dagster_home, url: str, crash_at: str | None) -> subprocess.CompletedProcess:
    env = {**os.environ, "DAGSTER_HOME": str(dagster_home), "BATCH_PIPELINE_SANDBOX_URL": url}
    env.pop("BATCH_PIPELINE_CRASH_AT", None)
    if crash_at:
        env["BATCH_PIPELINE_CRASH_AT"] = crash_at
    return cli.run(["run", spec.source_path, "--home", str(home)], env=env, timeout=240)


def _answers(home, job: str) -> pl.DataFrame:
    table = pl.read_parquet(Store(home).read_bytes(JobPaths(job).validated))
    return table.select("source", "line", "request_id", "output").sort("line")


def _clean_answers(shape: str, make_job, instance, resources, home) -> pl.DataFrame:
    """What a run that nobody killed publishes (once per shape: the sandbox answers deterministically)."""
    if shape not in _reference:
        spec = _spec(make_job, shape)
        clean_home = home.parent / f"clean-{shape}"
        report = run_job(spec, instance, {**resources, "store": type(resources["store"])(root=str(clean_home))})
        assert report["complete"]
        _reference[shape] = _answers(clean_home, spec.name).drop("source")
    return _reference[shape]


def _finish_by_sensors(spec, instance, resources) -> None:
    """Tick the shard driver and run what it asks for, as the daemon would, until the job publishes."""
    stages = {"submit": ["submissions"], "collect": ["shard_results"], "quote": ["quote"], "publish": PUBLISH_ASSETS}
    sensor = build_shard_sensor(spec, build_jobs(spec))
    defs = build_definitions([spec], resources)
    for _ in range(40):
        out = sensor(dg.build_sensor_context(instance=instance, resources=resources))
        requests = [] if isinstance(out, dg.SkipReason) else list(out)
        for request in requests:
            stage = request.job_name.removeprefix(f"{spec.name}_")
            result = dg.materialize(
                [*defs.assets, *defs.asset_checks],
                instance=instance,
                resources=defs.resources,
                selection=[asset_key(spec, n) for n in stages[stage]],
                partition_key=request.partition_key,
                tags=request.tags,
                raise_on_error=False,
            )
            assert result.success, f"{stage} {request.partition_key} failed"
            if stage == "publish":
                return
    raise AssertionError(f"the sensors never published: last tick said {out}")


@pytest.mark.slow
@pytest.mark.parametrize(("point", "shape", "finish"), RUNS, ids=["-".join(r) for r in RUNS])
def test_a_kill_at_each_boundary_then_a_finish_bills_every_request_once(
    point, shape, finish, cli, sandbox, sandbox_proc, make_job, instance, resources, home, tmp_path
):
    _, url = sandbox_proc
    spec = _spec(make_job, shape)
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    killed = _cli(cli, spec, home, dagster_home, url, crash_at=point)
    assert killed.returncode == -signal.SIGKILL, f"the run never reached {point}:\n{killed.stdout}{killed.stderr}"
    if finish == "cli":
        done = _cli(cli, spec, home, dagster_home, url, crash_at=None)
        assert done.returncode == 0, done.stdout + done.stderr
    else:  # the daemon's view: the same instance the killed run used
        with dg.DagsterInstance.from_config(str(dagster_home)) as shared:
            _finish_by_sensors(spec, shared, resources)
    ledger = sandbox.ledger()
    batch_billed = Counter(e["custom_id"] for e in ledger if e.get("mode") != "online")
    online_billed = sum(1 for e in ledger if e.get("mode") == "online")
    assert max(batch_billed.values(), default=1) == 1, "a batch request was billed twice"
    # The one irreducible case: a SIGKILL while online requests are in flight. The provider bills them, the
    # answers die with the process, and no chat-completions API takes an idempotency key, so at most
    # `concurrency` of them are paid again (SIGTERM loses none: test_online_interrupt). Batch work never is.
    in_flight = ONLINE["settings"]["concurrency"] if point == "mid_stream" else 0
    assert 40 <= sum(batch_billed.values()) + online_billed <= 40 + in_flight, "a request was paid for twice"
    state = JobState.load(spec, Store(home))
    assert state.check().valid == 40
    answers = _answers(home, spec.name).drop("source")
    assert answers.equals(_clean_answers(shape, make_job, instance, resources, home))
