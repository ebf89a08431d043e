"""`dagster dev` with its daemon, driven only by the two sensors: a file dropped into an empty input folder
-> `<job>_new_data` -> prepare run -> `<job>_shard_driver` -> submit / collect runs per shard -> publish run.

Nothing is launched by hand: both sensors are started over GraphQL (`startSensor`), the daemon evaluates them
every `BATCH_PIPELINE_SENSOR_INTERVAL_S` = 2 s (its loop runs at most every 5 s) and the run queue launches
what they request. The run history must show the order the sensors promise: no shard run is created or
started before the manifest run ended; the canary shard (`canary_first`, the default) is collected before any
other shard is submitted; each shard is submitted and collected once; then the validated table and the
sandbox's billing ledger are checked.

The code location is the product's with one change, the in-process executor (see IN_PROCESS_LOCATION); the
job spec is the demo's on 2 shards of 20, without golden probes (`quality: null`).

The instance is a real Postgres, as the Helm deployment keeps it: DAGSTER_HOME's dagster.yaml has `storage:
postgres` in the chart's shape (password from `$DAGSTER_PG_PASSWORD`). The UI-launched flow (`browser/test_dagster_ui.py`)
runs on the default SQLite instance, so each storage gets one whole `dagster dev` flow (the two flows used to run
on both: four `dagster dev`s for two flows).
"""

from __future__ import annotations

import os
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import yaml

from batch_pipeline.core.spec.paths import JobPaths

from ..defs.postgres import PASSWORD_ENV, postgres_dagster_home
from .conftest import JOB, LOCATION, REPOSITORY, SMALL, DagsterDev, Project, run_dagster_dev, write_project
from .graphql import ROWS, RUNS, TERMINAL, failure_report

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]  # the bounds below, not the global 300 s

INTERVAL_S = 2
SHARDS = ["s00001", "s00002"]  # 40 rows, 20 requests a shard: the canary and one more
DEQUEUE_INTERVAL_S = 1
# how often the tests read the runs and ticks while they wait: the sensor interval. Every read is a GraphQL query
# the webserver answers; at 0.5 s the webserver and this process spent 6-8 CPU s more over a quota flow (~90 s)
# than at 2 s, for a flow whose steps are ticks 2 s apart
POLL_S = 2.0
FIRST_TICK_TIMEOUT_S = 60.0  # the daemon starts with `dagster dev`, its first sensor loop can lag the webserver
FLOW_TIMEOUT_S = 240.0  # file dropped -> publish succeeded: 6 runs, one after the other
SENSOR_TAG = "dagster/sensor_name"
NEW_DATA = f"{JOB}_new_data"
DRIVER = f"{JOB}_shard_driver"
PREPARE, QUOTE, SUBMIT, COLLECT, PUBLISH = (f"{JOB}_{s}" for s in ("prepare", "quote", "submit", "collect", "publish"))
REPO_SELECTOR = {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY}
# The product's code location (same sensors, jobs, assets, checks, resources) with the in-process executor:
# the runs the sensors request carry no run config, and the default multiprocess executor spends a process
# spawn and a full import (~3-5 s here) per step, which alone doubles the time of the flow. Each run still
# gets its own run worker launched by the code server; only its steps share that process.
IN_PROCESS_LOCATION = """
import dagster as dg

import batch_pipeline.definitions as product

defs = dg.Definitions.merge(product.defs, dg.Definitions(executor=dg.in_process_executor))
"""

SENSORS = """
query Sensors($repo: RepositorySelector!) {
  sensorsOrError(repositorySelector: $repo) {
    __typename
    ... on Sensors {
      results {
        name
        minIntervalSeconds
        targets { pipelineName }
        sensorState { status repositoryOrigin { repositoryName repositoryLocationName } }
      }
    }
    ... on Error { message }
  }
}
"""

START_SENSOR = """
mutation Start($selector: SensorSelector!) {
  startSensor(sensorSelector: $selector) {
    __typename
    ... on Sensor { name sensorState { status } }
    ... on Error { message }
  }
}
"""

SENSOR_TICKS = """
query Ticks($selector: SensorSelector!) {
  sensorOrError(sensorSelector: $selector) {
    __typename
    ... on Sensor {
      sensorState { ticks(limit: 10) { status timestamp skipReason runKeys error { message } } }
    }
    ... on Error { message }
  }
}
"""


def make_sensor_project(root: Path) -> Project:
    """The e2e job spec reading `<root>/inputs/*.jsonl`, an empty folder; no golden probes (`quality`), so the
    ledger holds exactly the 40 manifest requests."""
    inputs = root / "inputs"
    inputs.mkdir()
    project = write_project(root, str(inputs / "*.jsonl"), shards={"max_requests": 20}, quality=None)
    # the run queue of this test instance is polled every second (Dagster's default: 5 s)
    instance_yaml = project.dagster_home / "dagster.yaml"
    config = yaml.safe_load(instance_yaml.read_text())
    config["run_queue"] = {"dequeue_interval_seconds": DEQUEUE_INTERVAL_S}
    instance_yaml.write_text(yaml.safe_dump(config, sort_keys=False))
    (root / "in_process_location.py").write_text(IN_PROCESS_LOCATION)
    (root / "workspace.yaml").write_text(
        yaml.safe_dump(
            {
                "load_from": [
                    {
                        "python_file": {
                            "relative_path": "in_process_location.py",
                            "attribute": "defs",
                            "location_name": LOCATION,
                        }
                    }
                ]
            }
        )
    )
    return project


@pytest.fixture(scope="module")
def sensor_project(tmp_path_factory, postgres) -> Project:
    project = make_sensor_project(tmp_path_factory.mktemp("e2e_sensors"))
    postgres_dagster_home(project.dagster_home, postgres, postgres.create_database("e2e_sensors"))
    return project


@pytest.fixture(scope="module")
def sensor_dev(sandbox_proc, sensor_project: Project, postgres) -> Iterator[DagsterDev]:
    _, sandbox_url = sandbox_proc
    env = {"BATCH_PIPELINE_SENSOR_INTERVAL_S": str(INTERVAL_S), PASSWORD_ENV: postgres.password}
    with run_dagster_dev(sandbox_url, sensor_project, env, workspace=sensor_project.root / "workspace.yaml") as dev:
        yield dev


def sensor_selectors(dev: DagsterDev) -> dict[str, dict[str, str]]:
    """Name -> SensorSelector of every sensor of the repository, as `sensorsOrError` reports them."""
    out = dev.gql(SENSORS, repo=REPO_SELECTOR)["sensorsOrError"]
    assert out["__typename"] == "Sensors", out
    selectors = {}
    for s in out["results"]:
        origin = s["sensorState"]["repositoryOrigin"]
        selectors[s["name"]] = {
            "repositoryLocationName": origin["repositoryLocationName"],
            "repositoryName": origin["repositoryName"],
            "sensorName": s["name"],
        }
        assert s["minIntervalSeconds"] == INTERVAL_S, s  # the env var reached the code server
        assert s["sensorState"]["status"] == "STOPPED", s  # nothing runs until started
    targets = {s["name"]: {t["pipelineName"] for t in s["targets"]} for s in out["results"]}
    assert targets.get(NEW_DATA) == {PREPARE}, targets
    assert {SUBMIT, COLLECT, PUBLISH} <= targets.get(DRIVER, set()), targets
    return selectors


def start_sensor(dev: DagsterDev, selector: dict[str, str]) -> None:
    out = dev.gql(START_SENSOR, selector=selector)["startSensor"]
    assert out["__typename"] == "Sensor" and out["sensorState"]["status"] == "RUNNING", out


def ticks(dev: DagsterDev, selector: dict[str, str]) -> list[dict[str, Any]]:
    out = dev.gql(SENSOR_TICKS, selector=selector)["sensorOrError"]
    assert out["__typename"] == "Sensor", out
    return out["sensorState"]["ticks"]


def all_runs(dev: DagsterDev) -> list[dict[str, Any]]:
    out = dev.gql(RUNS)["runsOrError"]
    assert out["__typename"] == "Runs", out
    for r in out["results"]:
        r["tags"] = {t["key"]: t["value"] for t in r["tags"]}
    return out["results"]


def history(dev: DagsterDev, selectors: dict[str, dict[str, str]], runs: list[dict[str, Any]]) -> str:
    """The runs and the latest sensor ticks, for an assertion message."""
    lines = [
        f"{r['jobName']} {r['tags'].get('dagster/partition', '')} {r['status']} "
        f"created={r['creationTime']} start={r['startTime']} end={r['endTime']}"
        for r in runs
    ]
    for name in (NEW_DATA, DRIVER):
        for t in ticks(dev, selectors[name]):
            lines.append(f"tick {name} {t['status']} {t['skipReason'] or ''} {t['error'] or ''} {t['runKeys']}")
    return "\n".join(lines) + f"\n--- dagster dev log ---\n{dev.log_tail(2500)}"


def wait_for_publish(dev: DagsterDev, selectors: dict[str, dict[str, str]]) -> list[dict[str, Any]]:
    """Poll the run history until a publish run succeeded (fail fast on a failed run); return every run."""
    deadline = time.monotonic() + FLOW_TIMEOUT_S
    while True:
        dev.watch()  # run workers come and go: record them for the teardown check
        runs = all_runs(dev)
        failed = [r for r in runs if r["status"] in TERMINAL - {"SUCCESS"}]
        if failed:
            raise AssertionError(
                "\n\n".join(
                    f"run {r['jobName']} {r['tags'].get('dagster/partition', '')} "
                    f"({r['runId']}) ended {r['status']}:\n{failure_report(dev, r['runId'])}"
                    for r in failed
                )
                + "\n\n"
                + history(dev, selectors, runs)
            )
        if any(r["jobName"] == PUBLISH and r["status"] == "SUCCESS" for r in runs):
            return runs
        if time.monotonic() > deadline:
            raise AssertionError(
                f"no successful {PUBLISH} run {FLOW_TIMEOUT_S} s after the file was dropped:\n"
                + history(dev, selectors, runs)
            )
        time.sleep(POLL_S)


def test_dropped_file_runs_the_job_through_the_sensors(sensor_dev: DagsterDev):
    dev = sensor_dev
    project = dev.project
    inputs = project.root / "inputs"
    assert not any(inputs.iterdir())

    # both sensors, found through sensorsOrError and started like the UI's toggle does
    selectors = sensor_selectors(dev)
    assert set(selectors) == {NEW_DATA, DRIVER}, sorted(selectors)
    for name in (NEW_DATA, DRIVER):
        start_sensor(dev, selectors[name])

    # an empty input folder is a skipped tick, not a crash and not a run
    deadline = time.monotonic() + FIRST_TICK_TIMEOUT_S
    while not (done := [t for t in ticks(dev, selectors[NEW_DATA]) if t["status"] != "STARTED"]):
        assert time.monotonic() < deadline, f"no tick of {NEW_DATA} in {FIRST_TICK_TIMEOUT_S} s:\n{dev.log_tail()}"
        dev.watch()
        time.sleep(POLL_S)
    assert done[0]["status"] == "SKIPPED" and "no input" in done[0]["skipReason"], done
    assert all_runs(dev) == []

    # drop the file: written under a name the glob ignores, then renamed, so no tick sees it half-written
    dropped = time.monotonic()
    partial = inputs / ".tickets.jsonl.part"
    shutil.copy(SMALL, partial)
    os.replace(partial, inputs / "tickets.jsonl")
    runs = wait_for_publish(dev, selectors)
    flow_s = time.monotonic() - dropped
    context = history(dev, selectors, runs)

    by_job: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        by_job.setdefault(r["jobName"], []).append(r)
    # a `<job>_quote` run only if the driver found the quote expiring (not within this test's minute)
    assert {PREPARE, SUBMIT, COLLECT, PUBLISH} <= set(by_job) <= {PREPARE, QUOTE, SUBMIT, COLLECT, PUBLISH}, context
    assert all(r["status"] == "SUCCESS" for r in runs), context

    # one manifest run, requested by the new-data sensor for this input listing
    [prepare] = by_job[PREPARE]
    assert prepare["tags"][SENSOR_TAG] == NEW_DATA, prepare["tags"]
    assert prepare["tags"]["batch_pipeline/trigger"] == "new_data"
    assert prepare["tags"]["dagster/run_key"].startswith("prepare:")
    assert prepare["endTime"] is not None

    # every shard submitted once and collected once; these and publish requested by the shard driver
    for job in (SUBMIT, COLLECT):
        assert sorted(r["tags"]["dagster/partition"] for r in by_job[job]) == SHARDS, (job, context)
        stage = job.removeprefix(f"{JOB}_")
        for r in by_job[job]:
            shard = r["tags"]["dagster/partition"]
            first = "canary" if stage == "submit" and shard == SHARDS[0] else stage  # the canary went first
            assert r["tags"]["dagster/run_key"] == f"{first}:{shard}:1", r["tags"]
    [publish] = by_job[PUBLISH]
    assert publish["tags"]["dagster/run_key"] == f"publish:{ROWS}"
    driven = [r for r in runs if r["jobName"] != PREPARE]
    assert all(r["tags"].get(SENSOR_TAG) == DRIVER for r in driven), [(r["jobName"], r["tags"]) for r in driven]

    # order (creationTime: when the sensor tick created the run; startTime / endTime: its first / last event)
    def created_after(run: dict[str, Any], t: float) -> bool:
        return run["creationTime"] > t and run["startTime"] > t

    # nothing of a shard (nor a re-quote, nor publish) was created or started before the manifest run ended
    for r in driven:
        assert created_after(r, prepare["endTime"]), (
            f"{r['jobName']} {r['tags'].get('dagster/partition', '')} began before the manifest run ended",
            context,
        )
    # the canary shard was submitted alone and collected before any other shard was submitted
    canary, *others = SHARDS
    [canary_collect] = [r for r in by_job[COLLECT] if r["tags"]["dagster/partition"] == canary]
    for r in by_job[SUBMIT]:
        if r["tags"]["dagster/partition"] in others:
            assert created_after(r, canary_collect["startTime"]), (
                f"{r['tags']['dagster/partition']} submitted before the canary {canary} was collected",
                context,
            )

    # the validated table in the store ($BATCH_PIPELINE_HOME)
    validated = project.home / JobPaths(JOB).validated
    assert validated.is_file(), sorted(str(p) for p in project.home.rglob("*.parquet"))[:20]
    table = pl.read_parquet(validated)
    assert table.height == ROWS
    assert table["request_id"].n_unique() == ROWS and table["output"].null_count() == 0

    # the sandbox billed each of the 40 requests exactly once
    billed = Counter(e["custom_id"] for e in dev.sandbox.ledger())
    assert len(billed) == ROWS and set(billed.values()) == {1}, billed.most_common(3)
    assert set(billed) == set(table["request_id"].to_list())
    print(f"file dropped -> publish succeeded in {flow_s:.1f} s, {len(runs)} runs")


def test_the_runs_are_in_postgres(sensor_dev: DagsterDev, postgres):
    """Runs after the flow above (tests run in file order): the instance's run table in Postgres holds them, and
    nothing was written to a SQLite file in DAGSTER_HOME."""
    conn = postgres.connect("e2e_sensors")
    with conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM runs")
        (runs,) = cur.fetchone()
    conn.close()
    assert runs >= 6, runs
    assert not list(sensor_dev.project.dagster_home.rglob("*.db")), list(sensor_dev.project.dagster_home.rglob("*"))
