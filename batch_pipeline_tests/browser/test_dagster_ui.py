"""What a person sees in the Dagster UI after the demo ran: each page opened in headless Chromium, its text that
matters asserted, a screenshot saved (see conftest.py for the project and how it was materialized).

The pages: the asset graph of the job, the `results` asset (its checks passed, its metadata and preview), a failed
blocking check (the `gate` job's), the runs list and one shard partition.
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Locator, Page, expect

from .conftest import FAILED_CHECK, GATE, JOB, SHARDS, Materialized

pytestmark = pytest.mark.e2e

# backend_comparison is made with the manifest (the demo's spec has cost_compare): every asset of the graph runs
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
RESULT_CHECKS = [
    "validated_schema",
    "outputs_within_contract",
    "no_truncated_outputs",
    "reconciliation",
    "shard_distributions",
]
PARTITIONED = {"submissions", "shard_results"}
LABELS = {"billing", "bug", "feature_request", "account", "other"}
ROWS = 40
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
