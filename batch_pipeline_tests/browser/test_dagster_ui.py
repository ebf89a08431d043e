"""The demo launched in `dagster dev` over GraphQL as the UI launches it (prepare -> the canary and the shards in
ranged runs -> publish), then checked three ways: what Dagster recorded (runs, asset checks, materialization
metadata, over GraphQL), the validated Parquet file in the store and the sandbox's billing ledger; and what a person
sees in the UI: each page opened in headless Chromium, its text that matters asserted, a screenshot saved (see
conftest.py for the project and how it was materialized). One `dagster dev` serves both.

The pages: the asset graph of the job, the `results` asset (its checks passed, its metadata and preview), a failed
blocking check (the `gate` job's), the runs list and one shard partition.
"""

from __future__ import annotations

import re
from collections import Counter

import openai
import polars as pl
import pytest
from playwright.sync_api import Locator, Page, expect

from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline_tests.e2e.graphql import (
    ASSET_NODE,
    ASSET_NODES,
    ASSETS,
    JOB_PARTITIONS,
    LATEST_MATERIALIZATION,
    RANGE_END,
    RANGE_START,
    ROWS,
    RUNS,
    job_selector,
)
from batch_pipeline_tests.e2e.graphql import RESULT_CHECKS as BLOCKING_CHECKS

from .conftest import FAILED_CHECK, GATE, JOB, SHARDS, Materialized

pytestmark = pytest.mark.e2e

RESULT_CHECKS = [*sorted(BLOCKING_CHECKS), "shard_distributions"]
PARTITIONED = {"submissions", "shard_results"}
LABELS = {"billing", "bug", "feature_request", "account", "other"}
# wide enough that the graph, fitted to the page, draws its nodes in full (a narrower one draws names only)
GRAPH_VIEWPORT = {"width": 2200, "height": 1000}


def alone(page: Page, key: Locator, others: Locator) -> Locator:
    """The outermost <div> that holds `key` and none of `others`: one graph node, one run's row, one check's entry."""
    return page.locator("div").filter(has=key).filter(has_not=others).first


def one_of(page: Page, name: str, names: list[str]) -> Locator:
    """The <div> of `name` among things called `names` (graph nodes, list entries)."""
    others = "|".join(re.escape(n) for n in names if n != name)
    return alone(page, page.get_by_text(name, exact=True), page.get_by_text(re.compile(f"^({others})$")))


def graph_node(page: Page, asset: str) -> Locator:
    return one_of(page, asset, ASSETS)


def partition_detail(page: Page, shard: str) -> Locator:
    """The right-hand pane of a partition page: the selected shard's latest materialization (not the list, whose
    header counts the materialized partitions)."""
    return alone(
        page,
        page.get_by_text("Latest materialization", exact=True),
        page.get_by_text(re.compile(r"^Materialized \(\d+\)$")),
    )


def open_page(page: Page, materialized: Materialized, path: str) -> None:
    # the first visit of an instance shows a newsletter dialog over the page: dismissed whenever it shows
    page.add_locator_handler(
        page.get_by_text("Join the Dagster community"), lambda: page.get_by_role("button", name="Skip").click()
    )
    page.goto(materialized.url + path)


def test_the_asset_graph_shows_every_asset_materialized_with_its_checks(materialized, page, screenshot):
    page.set_viewport_size(GRAPH_VIEWPORT)
    open_page(page, materialized, f"/locations/batch_pipeline/asset-groups/{JOB}")
    for asset in ASSETS:
        node = graph_node(page, asset)
        if asset in PARTITIONED:  # every shard partition materialized
            expect(node).to_contain_text(f"{len(SHARDS)} partitions")
            expect(node).to_contain_text("100% filled")
        else:
            expect(node).to_contain_text("Materialized")
        expect(node).not_to_contain_text("Never materialized")
    expect(graph_node(page, "results")).to_contain_text("5 / 5 Passed")  # its 4 blocking checks + the statistics
    expect(graph_node(page, "quote")).to_contain_text("1 / 1 Passed")  # the budget check
    expect(graph_node(page, "validated")).to_contain_text("Parquet")  # its kinds, under the node
    expect(graph_node(page, "validated")).to_contain_text("DuckDB")  # the views over the validated table
    screenshot("asset_graph", around=[graph_node(page, a) for a in ASSETS])


def test_the_results_page_shows_its_checks_passed_its_metadata_and_a_preview(materialized, page, screenshot):
    open_page(page, materialized, f"/assets/{JOB}/results")
    status = page.get_by_text("Latest check results").locator("xpath=..")
    expect(status).to_contain_text(str(len(RESULT_CHECKS)))
    expect(page.get_by_text("Row count").locator("xpath=..")).to_contain_text(str(ROWS))
    metadata = page.locator("table").filter(has_text="preview")
    expect(metadata).to_contain_text(f"jobs/{JOB}/staged/{JOB}.parquet")
    preview = metadata.locator("table").filter(has_text="source_key")
    expect(preview).to_contain_text("output")
    rows = preview.locator("tr").all_inner_texts()
    assert len(rows) >= 6, rows  # a header and the first rows of the staged table
    labels = {cell for row in rows[1:] for cell in row.split("\t")} & LABELS
    assert labels, f"no label among the preview's cells: {rows[:3]}"
    assert any(re.match(r"T\d{6}\b", row) for row in rows[1:]), rows[:3]  # the tickets' keys
    screenshot("results")

    page.get_by_role("tab", name="Checks").click()
    expect(page.get_by_text(f"Checks ({len(RESULT_CHECKS)})")).to_be_visible()
    for check in RESULT_CHECKS:
        expect(one_of(page, check, RESULT_CHECKS)).to_contain_text("Succeeded")
    expect(page.get_by_text("Failed", exact=True)).to_have_count(0)
    screenshot("results_checks")


def test_a_failed_blocking_check_shows_why_and_what_it_blocked(materialized, page, screenshot):
    open_page(page, materialized, f"/assets/{GATE}/results?view=checks&checkDetail={FAILED_CHECK}")
    expect(page.get_by_text("This is a blocking asset check.")).to_be_visible()
    result = page.get_by_text("Evaluation result").locator("xpath=..")
    expect(result).to_contain_text("Failed")
    truncated = page.locator("tr").filter(has=page.get_by_text("truncated", exact=True))
    expect(truncated.locator("td")).to_have_text(["truncated", "1"])  # the one truncated answer written in
    expect(one_of(page, FAILED_CHECK, RESULT_CHECKS)).to_contain_text("Failed")
    expect(one_of(page, "reconciliation", RESULT_CHECKS)).to_contain_text("Succeeded")  # the IDs still add up
    screenshot("failed_check")

    # the check blocked the promotion: the gate's validated table was not materialized by its publish run
    open_page(page, materialized, f"/assets/{GATE}/validated")
    latest = page.get_by_text("Latest materialization").locator("xpath=..")
    expect(latest).to_contain_text("Failed in")
    expect(latest).to_contain_text(materialized.runs["gate_publish"][:8])
    expect(page.get_by_text("No metadata found")).to_be_visible()
    screenshot("blocked_validated")


def test_the_runs_list_shows_every_run_with_its_job_and_status(materialized, page, screenshot):
    open_page(page, materialized, "/runs")
    expected = {
        "prepare": (f"{JOB}_prepare", "Success"),
        "canary": (f"{JOB}_shards", "Success"),
        "shards": (f"{JOB}_shards", "Success"),
        "publish": (f"{JOB}_publish", "Success"),
        "gate_prepare": (f"{GATE}_prepare", "Success"),
        "gate_shards": (f"{GATE}_shards", "Success"),
        "gate_publish": (f"{GATE}_publish", "Failure"),
    }
    assert set(expected) == set(materialized.runs)
    for what, (job, status) in expected.items():
        run_id = materialized.runs[what]
        row = alone(
            page,
            page.get_by_role("link", name=f"run {run_id[:8]}"),
            page.get_by_role("link", name=re.compile(rf"^run (?!{run_id[:8]})")),
        )
        expect(row.get_by_role("link", name=job, exact=True)).to_be_visible()
        expect(row).to_contain_text(status)
    expect(page.get_by_role("link", name=re.compile(r"^run [0-9a-f]{8}$"))).to_have_count(len(expected))
    screenshot("runs")


def test_a_shard_partition_page_shows_its_run_and_counts(materialized, page, screenshot):
    shard = SHARDS[1]  # collected in the ranged run of the shards after the canary
    open_page(page, materialized, f"/assets/{JOB}/shard_results?view=partitions&partition={shard}")
    expect(page.get_by_text(f"Materialized ({len(SHARDS)})")).to_be_visible()
    detail = partition_detail(page, shard)
    expect(detail.get_by_text(shard, exact=True).first).to_be_visible()
    expect(detail).to_contain_text("Materialized")
    expect(detail).to_contain_text(materialized.runs["shards"][:8])
    expect(detail).to_contain_text(f"{JOB}_shards")
    # a ranged run: its totals are labelled as the run's, each shard's own counts are a row of per_shard
    for label in ("shards_in_run", "run_results", "run_succeeded", "run_rescued_online", "per_shard"):
        expect(detail.get_by_text(label, exact=True)).to_be_visible()
    screenshot("shard_partition")


def test_a_shard_partition_page_counts_only_that_shard(materialized, page):
    """Dagster records one materialization for a ranged run's partitions: the page must not show the range's
    totals as the shard's own ('results 30' on a 10-item shard), but the shard's own row."""
    shard = SHARDS[1]
    open_page(page, materialized, f"/assets/{JOB}/shard_results?view=partitions&partition={shard}")
    detail = partition_detail(page, shard)
    expect(detail.get_by_text("per_shard", exact=True)).to_be_visible()
    labels = [row.split("\t")[0].strip() for row in detail.locator("tr").all_inner_texts()]
    assert "run_results" in labels and "results" not in labels, labels  # the range's total is not the shard's
    own = detail.locator("tr").filter(has=page.get_by_text(shard, exact=True)).last
    cells = [c.strip() for c in own.inner_text().split("\t")]
    assert cells[:3] == [shard, str(ROWS // len(SHARDS)), str(ROWS // len(SHARDS))], cells
    total = detail.locator("tr").filter(has=page.get_by_text("run_results", exact=True)).first
    in_run = len(SHARDS) - 1  # every shard after the canary went in the one ranged run
    assert total.inner_text().split("\t")[1].strip() == str(in_run * ROWS // len(SHARDS)), total.inner_text()


def _batches_of(sandbox_url: str, job: str) -> set[str]:
    """The IDs of the sandbox's batches our executor made for ``job`` (its batch metadata names the job)."""
    client = openai.OpenAI(base_url=f"{sandbox_url}/v1", api_key="sk-sandbox")
    return {b.id for b in client.batches.list(limit=100) if (b.metadata or {}).get("job") == job}


def test_over_graphql_the_job_ran_its_stages_passed_its_checks_and_billed_each_request_once(materialized, sandbox_proc):
    dev, runs = materialized.dev, materialized.runs
    key = lambda name: {"path": [JOB, name]}  # noqa: E731

    # the asset graph of the job
    nodes = {tuple(n["assetKey"]["path"]): n for n in dev.gql(ASSET_NODES)["assetNodes"]}
    assert {k for k in nodes if k[0] == JOB} == {(JOB, a) for a in ASSETS}, sorted(nodes)
    assert {a for (j, a), n in nodes.items() if j == JOB and n["isPartitioned"]} == PARTITIONED
    assert f"{JOB}_shards" in nodes[(JOB, "submissions")]["jobNames"]

    # prepare registered the shards as dynamic partitions
    parts = dev.gql(JOB_PARTITIONS, selector=job_selector(f"{JOB}_shards"))["pipelineOrError"]
    assert parts["__typename"] == "Pipeline", parts
    assert parts["partitionKeysOrError"]["partitionKeys"] == SHARDS
    assert dev.gql(ASSET_NODE, key=key("submissions"))["assetNodeOrError"]["partitionKeys"] == SHARDS

    # the job's run history: exactly its four runs (prepare, the canary's ranged run, the shards' ranged run after
    # the canary passed, publish), all successful, the shards run tagged with its range
    listed = dev.gql(RUNS)["runsOrError"]
    assert listed["__typename"] == "Runs", listed
    by_id = {r["runId"]: r for r in listed["results"] if r["jobName"].startswith(f"{JOB}_")}
    order = [runs[w] for w in ("prepare", "canary", "shards", "publish")]
    assert set(by_id) == set(order)
    assert {r["status"] for r in by_id.values()} == {"SUCCESS"}
    assert [by_id[r]["jobName"] for r in order] == [
        f"{JOB}_prepare",
        f"{JOB}_shards",
        f"{JOB}_shards",
        f"{JOB}_publish",
    ]
    shard_tags = {t["key"]: t["value"] for t in by_id[runs["shards"]]["tags"]}
    assert shard_tags[RANGE_START] == SHARDS[0] and shard_tags[RANGE_END] == SHARDS[-1]

    # the blocking checks on <job>/results passed, evaluated against the publish run's materialization
    node = dev.gql(ASSET_NODE, key=key("results"))["assetNodeOrError"]
    assert node["__typename"] == "AssetNode", node
    checks_or_error = node["assetChecksOrError"]
    assert checks_or_error["__typename"] == "AssetChecks", checks_or_error
    checks = {c["name"]: c for c in checks_or_error["checks"]}
    assert set(checks) == set(RESULT_CHECKS)
    assert not checks["shard_distributions"]["blocking"]  # per-shard statistics warn, they do not block
    for name, check in checks.items():
        assert check["blocking"] == (name in BLOCKING_CHECKS), name
        execution = check["executionForLatestMaterialization"]
        assert execution is not None, f"check {name} has no execution for the latest materialization"
        assert execution["runId"] == runs["publish"], name
        assert execution["status"] == "SUCCEEDED" and execution["evaluation"]["success"], (name, execution)

    # the materialization of <job>/results: 40 rows and a preview
    mats = dev.gql(LATEST_MATERIALIZATION, key=key("results"))["assetOrError"]
    assert mats["__typename"] == "Asset", mats
    [mat] = mats["assetMaterializations"]
    assert mat["runId"] == runs["publish"]
    meta = {m["label"]: m for m in mat["metadataEntries"]}
    assert meta["rows"]["__typename"] == "IntMetadataEntry" and meta["rows"]["intValue"] == ROWS, meta.get("rows")
    assert meta["dagster/row_count"]["intValue"] == ROWS
    preview = meta["preview"]
    assert preview["__typename"] == "MarkdownMetadataEntry", preview
    assert "source_key" in preview["mdStr"] and preview["mdStr"].count("\n") >= 3, preview["mdStr"][:500]

    # <job>/validated: promoted in the publish run, once its checks passed
    [promoted] = dev.gql(LATEST_MATERIALIZATION, key=key("validated"))["assetOrError"]["assetMaterializations"]
    assert promoted["runId"] == runs["publish"]
    assert {m["label"]: m for m in promoted["metadataEntries"]}["dagster/row_count"]["intValue"] == ROWS

    # the validated table in the store ($BATCH_PIPELINE_HOME)
    home = dev.project.home
    validated = home / JobPaths(JOB).validated
    assert validated.is_file(), sorted(str(p) for p in home.rglob("*.parquet"))[:20]
    table = pl.read_parquet(validated)
    assert table.height == ROWS
    assert table["request_id"].n_unique() == ROWS and table["output"].null_count() == 0

    # the sandbox billed each of the job's 40 requests exactly once (the gate job sends the same tickets in its own
    # batches), and nothing outside the two jobs' batches
    _, sandbox_url = sandbox_proc
    ours, gates = _batches_of(sandbox_url, JOB), _batches_of(sandbox_url, GATE)
    ledger = dev.sandbox.ledger()
    assert ours and gates and {e["batch_id"] for e in ledger} <= ours | gates
    billed = Counter(e["custom_id"] for e in ledger if e["batch_id"] in ours)
    assert len(billed) == ROWS and set(billed.values()) == {1}, billed.most_common(3)
    assert set(billed) == set(table["request_id"].to_list())
