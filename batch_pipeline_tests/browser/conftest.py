"""Fixtures for the browser tier: `dagster dev` on loopback with the demo materialized, seen through headless Chromium.

The project holds two job specs on a copy of tickets_small: `e2e` (4 shards of 10, materialized cleanly: prepare,
the canary, the other shards, publish) and `gate` (one shard of 40, whose publish run is made to fail a blocking
check: one truncated answer is written into its results, as a corrupted result part would be; test_gate's fault).
The runs are launched over GraphQL (the e2e tier's helpers); the pages are then opened by Debian's Chromium, driven
by Playwright with `executable_path` (Playwright's own browser downloads are never used). Each test saves a
screenshot under its tmp_path; with BATCH_PIPELINE_SAVE_SCREENSHOTS=DIR the two the README shows are also copied
into DIR (BATCH_PIPELINE_SAVE_SCREENSHOTS=docs/ui regenerates docs/ui/*.png).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from playwright.sync_api import BrowserContext, Locator, Page, Playwright, expect, sync_playwright

from batch_pipeline.core.spec.loading import load_spec
from batch_pipeline.core.store import Store
from batch_pipeline_tests.defs.test_gate import inject
from batch_pipeline_tests.e2e.conftest import JOB, SMALL, DagsterDev, run_dagster_dev, write_project
from batch_pipeline_tests.e2e.graphql import (
    RANGE_END,
    RANGE_START,
    RUN_STATUS,
    TERMINAL,
    failure_report,
    launch,
)

CHROMIUM = Path("/usr/bin/chromium")  # Debian's package (scripts/setup.sh installs it)
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SAVE_ENV = "BATCH_PIPELINE_SAVE_SCREENSHOTS"
README_SHOTS = {"asset_graph", "results"}  # the ones the README shows (docs/ui/<name>.png)
VIEWPORT = {"width": 1600, "height": 1000}
GATE = "gate"
FAILED_CHECK = "no_truncated_outputs"
SHARDS = ["s00001", "s00002", "s00003", "s00004"]
RUN_TIMEOUT_S = 120.0
UI_TIMEOUT_MS = 30_000  # a bound, not a timing: the UI's first GraphQL answers can be slow on a loaded machine

expect.set_options(timeout=UI_TIMEOUT_MS)


@dataclass(frozen=True)
class Materialized:
    """The `dagster dev` of the tier and the run IDs it holds."""

    dev: DagsterDev
    url: str
    runs: dict[str, str]  # what each run did (prepare, canary, shards, publish, gate_*) -> run ID


def wait_terminal(dev: DagsterDev, run_id: str, timeout: float = RUN_TIMEOUT_S) -> str:
    """The status a run ended with (the e2e helper insists on SUCCESS; the gate's publish must fail)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dev.watch()
        status = dev.gql(RUN_STATUS, runId=run_id)["runOrError"]["status"]
        if status in TERMINAL:
            return status
        time.sleep(0.25)
    raise AssertionError(f"run {run_id} did not end in {timeout} s:\n{failure_report(dev, run_id)}")


def _write_gate_spec(jobs_dir: Path) -> None:
    """The e2e spec again as `gate`, in one shard (its canary is the whole job: one shards run)."""
    spec = yaml.safe_load((jobs_dir / f"{JOB}.yaml").read_text())
    spec.update(name=GATE, shards={"max_requests": 100})
    (jobs_dir / f"{GATE}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))


def run_stage(dev: DagsterDev, stage: dict[str, tuple[str, dict[str, str] | None, str]]) -> dict[str, str]:
    """Launch the runs of one stage together (what -> (job, tags, expected status)); wait for all; their IDs."""
    ids = {what: launch(dev, job, tags) for what, (job, tags, _) in stage.items()}
    for what, (job, _, expected) in stage.items():
        status = wait_terminal(dev, ids[what])
        assert status == expected, f"{job} ({what}) ended {status}, not {expected}:\n{failure_report(dev, ids[what])}"
    return ids


@pytest.fixture(scope="module")
def materialized(sandbox_proc, tmp_path_factory) -> Iterator[Materialized]:
    """`dagster dev` on a free loopback port with `e2e` materialized and `gate`'s publish failed on a check.

    The two jobs' runs go in stages, a run of each job at a time (they share nothing but the instance)."""
    root = tmp_path_factory.mktemp("browser_project")
    (root / "inputs").mkdir()
    shutil.copy(SMALL, root / "inputs" / "tickets.jsonl")
    project = write_project(root, str(root / "inputs" / "tickets.jsonl"))
    _write_gate_spec(project.jobs_dir)
    _, sandbox_url = sandbox_proc
    everything = {RANGE_START: SHARDS[0], RANGE_END: SHARDS[-1]}
    with run_dagster_dev(sandbox_url, project) as dev:
        runs = run_stage(
            dev, {"prepare": (f"{JOB}_prepare", None, "SUCCESS"), "gate_prepare": (f"{GATE}_prepare", None, "SUCCESS")}
        )
        # the first ranged run collects the canary only (the other shards wait for its verdict); gate's one shard
        # is its canary
        runs |= run_stage(
            dev,
            {
                "canary": (f"{JOB}_shards", everything, "SUCCESS"),
                "gate_shards": (f"{GATE}_shards", {RANGE_START: SHARDS[0], RANGE_END: SHARDS[0]}, "SUCCESS"),
            },
        )
        # one truncated answer among gate's results, as a corrupted result part would hold: its publish must fail
        inject(Store(project.home), load_spec(project.jobs_dir / f"{GATE}.yaml"), FAILED_CHECK)
        runs |= run_stage(
            dev,
            {"shards": (f"{JOB}_shards", everything, "SUCCESS"), "gate_publish": (f"{GATE}_publish", None, "FAILURE")},
        )
        runs |= run_stage(dev, {"publish": (f"{JOB}_publish", None, "SUCCESS")})
        yield Materialized(dev, f"http://127.0.0.1:{dev.port}", runs)


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as pw:
        yield pw


@pytest.fixture(scope="module")
def browser(playwright: Playwright, tmp_path_factory) -> Iterator[BrowserContext]:
    """Headless Chromium (Debian's) in a new empty profile; Playwright launches it by path, downloads nothing."""
    assert CHROMIUM.is_file(), f"{CHROMIUM} is missing: scripts/setup.sh installs Debian's chromium package"
    context = playwright.chromium.launch_persistent_context(
        tmp_path_factory.mktemp("chromium_profile"),
        executable_path=str(CHROMIUM),
        headless=True,
        args=CHROMIUM_ARGS,
        viewport=VIEWPORT,
    )
    try:
        yield context
    finally:
        context.close()


@pytest.fixture
def page(browser: BrowserContext) -> Iterator[Page]:
    page = browser.new_page()
    page.set_default_timeout(UI_TIMEOUT_MS)
    try:
        yield page
    finally:
        page.close()


def _box(parts: list[Locator], margin: float = 24.0) -> dict[str, float]:
    boxes = [b for b in (p.bounding_box() for p in parts) if b]
    assert boxes, "nothing to frame"
    left, top = min(b["x"] for b in boxes) - margin, min(b["y"] for b in boxes) - margin
    right = max(b["x"] + b["width"] for b in boxes) + margin
    bottom = max(b["y"] + b["height"] for b in boxes) + margin
    return {"x": max(left, 0), "y": max(top, 0), "width": right - max(left, 0), "height": bottom - max(top, 0)}


@pytest.fixture
def screenshot(page: Page, tmp_path: Path):
    """`screenshot(name)`: a PNG of the page under tmp_path (README ones also into $BATCH_PIPELINE_SAVE_SCREENSHOTS)."""

    def take(name: str, around: list[Locator] | None = None) -> Path:
        """The viewport, or only the box around `around` (with a margin)."""
        path = tmp_path / f"{name}.png"
        page.screenshot(path=str(path), clip=_box(around) if around else None)
        assert path.stat().st_size > 10_000, f"{path} is nearly empty"
        if (target := os.environ.get(SAVE_ENV)) and name in README_SHOTS:
            Path(target).mkdir(parents=True, exist_ok=True)
            shutil.copy(path, Path(target) / path.name)
        return path

    return take
