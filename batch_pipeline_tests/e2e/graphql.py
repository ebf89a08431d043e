"""`dagster dev` driven over GraphQL as the UI drives it: the queries, launching a run, and a failed run's error
events for an assertion message (the e2e and browser tiers)."""

from __future__ import annotations

from typing import Any

from .conftest import LOCATION, REPOSITORY, DagsterDev

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
    ... on Runs { results { runId jobName status creationTime startTime endTime tags { key value } } }
    ... on Error { message }
  }
}
"""


def job_selector(job_name: str) -> dict[str, str]:
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
