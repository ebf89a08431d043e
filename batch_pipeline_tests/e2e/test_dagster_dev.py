"""`dagster dev` on loopback, driven over GraphQL like the UI does: prepare -> shards (one ranged run) -> publish.

The job runs against the real sandbox process; the results are checked three ways: what Dagster recorded
(runs, asset checks, materialization metadata), the validated Parquet file in the store, and the sandbox's
billing ledger (every request billed exactly once).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import polars as pl
import pytest

from batch_pipeline.core.spec.paths import JobPaths

from .conftest import JOB, LOCATION, REPOSITORY, DagsterDev

pytestmark = pytest.mark.e2e

RANGE_START = "dagster/asset_partition_range_start"
RANGE_END = "dagster/asset_partition_range_end"
ASSETS = [
    "manifest",
    "quote",
    "submissions",
    "shard_results",
    "results",
    "validated",
    "dead_letters",
    "report",
    "backend_comparison",
]
RESULT_CHECKS = {"validated_schema", "outputs_within_contract", "no_truncated_outputs", "reconciliation"}
SHARDS = ["s00001", "s00002", "s00003", "s00004"]
ROWS = 40
RUN_TIMEOUT_S = 120.0
TERMINAL = {"SUCCESS", "FAILURE", "CANCELED"}
# Each run still gets its own run-worker process (launched by the code server); its steps run in that
# process instead of one subprocess per step (the default multiprocess executor costs ~2.5 s a step, ~25 s
# for the 9 steps here). The steps, checks and events are the same.
RUN_CONFIG = {"execution": {"config": {"in_process": {}}}}

ASSET_NODES = """
query { assetNodes { assetKey { path } jobNames isPartitioned } }
"""

LAUNCH_RUN = """
mutation Launch($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId status } }
    ... on RunConfigValidationInvalid { errors { message } }
    ... on PythonError { message stack }
    ... on Error { message }
  }
}
"""

RUN_STATUS = """
query Status($runId: ID!) {
  runOrError(runId: $runId) {
    __typename
    ... on Run { runId status }
    ... on Error { message }
  }
}
"""

RUN_LOGS = """
query Logs($runId: ID!, $cursor: String) {
  logsForRun(runId: $runId, afterCursor: $cursor) {
    __typename
    ... on EventConnection {
      cursor
      hasMore
      events {
        __typename
        ... on MessageEvent { message level stepKey }
        ... on ExecutionStepFailureEvent { error { ...Err } }
        ... on RunFailureEvent { error { ...Err } }
        ... on AssetCheckEvaluationEvent { evaluation { checkName success } }
      }
    }
    ... on Error { message }
  }
}
fragment Err on PythonError {
  className message stack
  errorChain { error { className message stack } }
}
"""

JOB_PARTITIONS = """
query Partitions($selector: PipelineSelector!) {
  pipelineOrError(params: $selector) {
    __typename
    ... on Pipeline { partitionKeysOrError { partitionKeys } }
    ... on Error { message }
  }
}
"""

ASSET_NODE = """
query Node($key: AssetKeyInput!) {
  assetNodeOrError(assetKey: $key) {
    __typename
    ... on AssetNode {
      partitionKeys
      assetChecksOrError {
        __typename
        ... on AssetChecks {
          checks {
            name
            blocking
            executionForLatestMaterialization {
              runId
              status
              evaluation { success metadataEntries { label } }
            }
          }
        }
        ... on Error { message }
      }
    }
    ... on Error { message }
  }
}
"""

LATEST_MATERIALIZATION = """
query Materialization($key: AssetKeyInput!) {
  assetOrError(assetKey: $key) {
    __typename
    ... on Asset {
      assetMaterializations(limit: 1) {
        runId
        partition
        metadataEntries {
          __typename
          label
          ... on IntMetadataEntry { intValue }
          ... on MarkdownMetadataEntry { mdStr }
          ... on TextMetadataEntry { text }
          ... on PathMetadataEntry { path }
        }
      }
    }
    ... on Error { message }
  }
}
"""

RUNS = """
query {
  runsOrError {
    __typename
    ... on Runs { results { runId jobName status tags { key value } } }
    ... on Error { message }
  }
}
"""


def _selector(job_name: str) -> dict[str, str]:
    return {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY, "pipelineName": job_name}


def run_events(dev: DagsterDev, run_id: str) -> list[dict[str, Any]]:
    events, cursor = [], None
    while True:
        conn = dev.gql(RUN_LOGS, runId=run_id, cursor=cursor)["logsForRun"]
        assert conn["__typename"] == "EventConnection", conn
        events += conn["events"]
        cursor = conn["cursor"]
        if not conn["hasMore"]:
            return events


def failure_report(dev: DagsterDev, run_id: str) -> str:
    """The error events of a run (step failures, failed checks, ERROR logs), for an assertion message."""
    lines = []
    for e in run_events(dev, run_id):
        kind = e["__typename"]
        if kind in ("ExecutionStepFailureEvent", "RunFailureEvent"):
            err = e.get("error") or {}
            chain = [err] + [link["error"] for link in err.get("errorChain") or []]
            lines.append(f"{kind} {e.get('stepKey') or ''}: {e.get('message')}")
            lines += [f"  {c.get('className')}: {(c.get('message') or '').strip()}" for c in chain]
            if kind == "ExecutionStepFailureEvent":  # where the root cause was raised (user code)
                lines.append("".join(chain[-1].get("stack") or [])[-1500:])
        elif kind == "AssetCheckEvaluationEvent" and not e["evaluation"]["success"]:
            lines.append(f"check {e['evaluation']['checkName']} failed: {e.get('message')}")
        elif e.get("level") in ("ERROR", "CRITICAL"):
            lines.append(f"{kind} {e.get('stepKey') or ''}: {e.get('message')}")
    return "\n".join(lines) or "(no error events)"


def launch(dev: DagsterDev, job_name: str, tags: dict[str, str] | None = None) -> str:
    params = {
        "selector": {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY, "jobName": job_name},
        "runConfigData": RUN_CONFIG,
        "executionMetadata": {"tags": [{"key": k, "value": v} for k, v in (tags or {}).items()]},
    }
    out = dev.gql(LAUNCH_RUN, params=params)["launchRun"]
    assert out["__typename"] == "LaunchRunSuccess", f"launching {job_name}: {out}"
    return out["run"]["runId"]


def wait_for_run(dev: DagsterDev, run_id: str, job_name: str, timeout: float = RUN_TIMEOUT_S) -> str:
    deadline = time.monotonic() + timeout
    status = None
    while time.monotonic() < deadline:
        dev.watch()  # run workers are children of the code server: record them for the teardown check
        run = dev.gql(RUN_STATUS, runId=run_id)["runOrError"]
        assert run["__typename"] == "Run", run
        status = run["status"]
        if status in TERMINAL:
            break
        time.sleep(0.25)
    else:
        raise AssertionError(
            f"run {job_name} ({run_id}) still {status} after {timeout} s:\n"
            f"{failure_report(dev, run_id)}\n--- dagster dev log ---\n{dev.log_tail()}"
        )
    assert status == "SUCCESS", f"run {job_name} ({run_id}) ended {status}:\n{failure_report(dev, run_id)}"
    return status


def run_job(dev: DagsterDev, job_name: str, tags: dict[str, str] | None = None) -> str:
    run_id = launch(dev, job_name, tags)
    wait_for_run(dev, run_id, job_name)
    return run_id


def test_dagster_dev_runs_a_job_over_graphql(dagster_dev: DagsterDev):
    dev = dagster_dev
    project = dev.project
    key = lambda name: {"path": [JOB, name]}  # noqa: E731

    # the asset graph of the one job spec in $BATCH_PIPELINE_JOBS
    nodes = {tuple(n["assetKey"]["path"]): n for n in dev.gql(ASSET_NODES)["assetNodes"]}
    assert set(nodes) == {(JOB, a) for a in ASSETS}, sorted(nodes)
    assert {a for (_, a), n in nodes.items() if n["isPartitioned"]} == {"submissions", "shard_results"}
    assert f"{JOB}_shards" in nodes[(JOB, "submissions")]["jobNames"]

    # 1. prepare: manifest, quote and backend_comparison (the spec has cost_compare); the manifest registers the
    #    shards as dynamic partitions
    prepare = run_job(dev, f"{JOB}_prepare")
    parts = dev.gql(JOB_PARTITIONS, selector=_selector(f"{JOB}_shards"))["pipelineOrError"]
    assert parts["__typename"] == "Pipeline", parts
    assert parts["partitionKeysOrError"]["partitionKeys"] == SHARDS
    node = dev.gql(ASSET_NODE, key=key("submissions"))["assetNodeOrError"]
    assert node["partitionKeys"] == SHARDS

    # 2. all shards in one ranged run (BackfillPolicy.multi_run lets one run take a range of partitions): the
    #    first one runs only the canary (the other shards wait for its verdict, skipped, not failed); the second
    #    one, after the canary passed, runs the rest
    everything = {RANGE_START: SHARDS[0], RANGE_END: SHARDS[-1]}
    canary = run_job(dev, f"{JOB}_shards", everything)
    shards = run_job(dev, f"{JOB}_shards", everything)

    # 3. publish: results (the staged table, + its blocking checks), validated (promoted), dead letters, report
    publish = run_job(dev, f"{JOB}_publish")

    # the run history: exactly our three runs, all successful, the shards run tagged with its range
    runs = dev.gql(RUNS)["runsOrError"]
    assert runs["__typename"] == "Runs", runs
    by_id = {r["runId"]: r for r in runs["results"]}
    assert set(by_id) == {prepare, canary, shards, publish}
    assert {r["status"] for r in by_id.values()} == {"SUCCESS"}
    assert [by_id[r]["jobName"] for r in (prepare, canary, shards, publish)] == [
        f"{JOB}_prepare",
        f"{JOB}_shards",
        f"{JOB}_shards",
        f"{JOB}_publish",
    ]
    shard_tags = {t["key"]: t["value"] for t in by_id[shards]["tags"]}
    assert shard_tags[RANGE_START] == SHARDS[0] and shard_tags[RANGE_END] == SHARDS[-1]

    # the four blocking checks on <job>/results passed, evaluated against the publish run's materialization
    node = dev.gql(ASSET_NODE, key=key("results"))["assetNodeOrError"]
    assert node["__typename"] == "AssetNode", node
    checks_or_error = node["assetChecksOrError"]
    assert checks_or_error["__typename"] == "AssetChecks", checks_or_error
    checks = {c["name"]: c for c in checks_or_error["checks"]}
    assert set(checks) == RESULT_CHECKS | {"shard_distributions"}
    assert not checks["shard_distributions"]["blocking"]  # per-shard statistics warn, they do not block
    for name, check in checks.items():
        assert check["blocking"] == (name in RESULT_CHECKS), name
        execution = check["executionForLatestMaterialization"]
        assert execution is not None, f"check {name} has no execution for the latest materialization"
        assert execution["runId"] == publish, name
        assert execution["status"] == "SUCCEEDED" and execution["evaluation"]["success"], (name, execution)

    # the materialization of <job>/results: 40 rows and a preview
    mats = dev.gql(LATEST_MATERIALIZATION, key=key("results"))["assetOrError"]
    assert mats["__typename"] == "Asset", mats
    [mat] = mats["assetMaterializations"]
    assert mat["runId"] == publish
    meta = {m["label"]: m for m in mat["metadataEntries"]}
    assert meta["rows"]["__typename"] == "IntMetadataEntry" and meta["rows"]["intValue"] == ROWS, meta.get("rows")
    assert meta["dagster/row_count"]["intValue"] == ROWS
    preview = meta["preview"]
    assert preview["__typename"] == "MarkdownMetadataEntry", preview
    assert "source_key" in preview["mdStr"] and preview["mdStr"].count("\n") >= 3, preview["mdStr"][:500]

    # <job>/validated: promoted in the publish run, once its checks passed
    [promoted] = dev.gql(LATEST_MATERIALIZATION, key=key("validated"))["assetOrError"]["assetMaterializations"]
    assert promoted["runId"] == publish
    assert {m["label"]: m for m in promoted["metadataEntries"]}["dagster/row_count"]["intValue"] == ROWS

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
