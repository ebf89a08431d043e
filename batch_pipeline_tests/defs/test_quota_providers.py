"""Every provider's "not now" waits and finishes (issue 16), through the real SDKs against the sandbox, with no
quota configured: Anthropic's processing queue (429 rate_limit_error), Gemini's enqueued tokens and Vertex's
concurrent jobs (429 RESOURCE_EXHAUSTED), Bedrock's job quota (ServiceQuotaExceededException). Each refusal is
recorded with nothing billed, the limit is learned, and every item is billed exactly once. And a shard bigger than
the whole cap is sent in parts that fit."""

import threading
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import polars as pl
import pytest
import yaml

from batch_pipeline.core.ledger.attempts import AttemptLog
from batch_pipeline.core.ledger.reconcile import VALID
from batch_pipeline.core.manifest.read import Manifest
from batch_pipeline.core.publish.tables import JobState
from batch_pipeline.core.store import Store
from batch_pipeline.defs.pipeline import run_job
from batch_pipeline.defs.resources import PricesResource

from .conftest import REPO

GOOGLE = {
    "input_per_mtok": 0.30,
    "cached_input_per_mtok": 0.03,
    "output_per_mtok": 2.50,
    "batch_discount": 0.5,
    "checked": "2026-12-01",
}
CLAUDE = {
    "input_per_mtok": 0.80,
    "cached_input_per_mtok": 0.08,
    "output_per_mtok": 4.00,
    "batch_discount": 0.5,
    "checked": "2026-12-01",
}
BEDROCK_MODEL = "anthropic.claude-3-5-haiku-20241022-v1:0"


@pytest.fixture
def priced(resources, tmp_path, monkeypatch) -> dict:
    """The test resources with price rows for the Google and Bedrock models (data/prices.yaml may lack them)."""
    table = yaml.safe_load((REPO / "data" / "prices.yaml").read_text())
    for backend, model, row in (
        ("gemini_batch", "gemini-2.5-flash", GOOGLE),
        ("vertex_batch", "gemini-2.5-flash", GOOGLE),
        ("bedrock_batch", BEDROCK_MODEL, CLAUDE),
    ):
        table["prices"].setdefault(backend, {}).setdefault(model, row)
    path = Path(tmp_path) / "prices.yaml"
    path.write_text(yaml.safe_dump(table))
    monkeypatch.setenv("BATCH_PIPELINE_PRICES", str(path))
    return {**resources, "prices": PricesResource(path=str(path))}


def refused(spec, home) -> list[dict]:
    store = Store(home)
    return [
        r.refused
        for shard in Manifest(spec.name, store).shard_ids()
        for a in AttemptLog(store, spec.name, shard).all()
        for r in a.records.values()
        if getattr(r, "refused", None) is not None
    ]


def assert_finished_once(spec, home, sandbox, report) -> None:
    assert report["complete"], report
    state = JobState.load(spec, Store(home))
    counts = state.check()
    assert counts.valid == counts.expected
    valid = set(state.states.filter(pl.col("state") == VALID)["request_id"])
    billed = Counter(e["custom_id"] for e in sandbox.ledger() if e["custom_id"] in valid)
    assert billed == Counter(dict.fromkeys(valid, 1))


@contextmanager
def frozen_until_refused(sandbox, timeout_s: float = 120.0):
    """The sandbox clock stands still until the sandbox refused a create (or ``timeout_s`` passed: the test then
    fails its assertions, not hangs): on a loaded machine the creates came slower than a batch ends (0.5 s), the
    cap was never full, and nothing was refused. With the clock frozen no batch ends before the next create."""

    def thaw() -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not sandbox.load()["refusals"]:
            time.sleep(0.1)
        sandbox.clock(freeze=False)

    sandbox.clock(freeze=True)
    thread = threading.Thread(target=thaw, daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join(timeout=1)
        sandbox.clock(freeze=False)


def peak(sandbox, provider: str, what: str) -> int:
    return max((e[what] for e in sandbox.load()["events"] if e["provider"] == provider), default=0)


def test_anthropic_queue_depth_waits_and_finishes(sandbox, make_job, instance, resources, home):
    sandbox.set_scenario("normal", quota_enqueued_requests=15, in_progress_s=0.5)
    spec = make_job(model="claude-haiku-4-5", backend={"name": "anthropic_batch", "settings": {"sandbox": True}})
    report = run_job(spec, instance, resources)
    assert_finished_once(spec, home, sandbox, report)
    refusals = refused(spec, home)
    assert refusals and {r["dimension"] for r in refusals} == {"requests"}  # 429 rate_limit_error, learned
    assert 0 < peak(sandbox, "anthropic", "requests") <= 15


def test_gemini_resource_exhausted_waits_and_finishes(sandbox, make_job, instance, priced, home, monkeypatch):
    for name in ("GEMINI_API_KEY", "GOOGLE_API_KEY", "GOOGLE_GENAI_API_VERSION", "GOOGLE_GEMINI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    backend = {"name": "gemini_batch", "settings": {"sandbox": True}}
    probe = make_job("probe", model="gemini-2.5-flash", backend=backend)
    run_job(probe, instance, {**priced, "store": type(priced["store"])(root=str(home) + "-probe")})
    sizes = [e["tokens"] for e in sandbox.load()["events"] if e["event"] == "enqueue"]
    deltas = [b - a for a, b in zip([0, *sizes], sizes, strict=False) if b > a]
    cap = int(max(deltas) * 1.5)  # one batch fits, two do not
    sandbox.reset()
    sandbox.set_scenario("normal", quota_enqueued_tokens=cap, in_progress_s=0.5)
    spec = make_job(model="gemini-2.5-flash", backend=backend, canary_first=False)  # every shard offered at once
    with frozen_until_refused(sandbox):
        report = run_job(spec, instance, priced)
    assert_finished_once(spec, home, sandbox, report)
    assert refused(spec, home)  # RESOURCE_EXHAUSTED on create, recorded with nothing billed
    assert 0 < peak(sandbox, "gemini", "tokens") <= cap


def test_vertex_concurrent_jobs_wait_and_finish(vertex_sandbox, make_job, instance, priced, home):
    vertex_sandbox.set_scenario("normal", quota_concurrent_jobs=1, in_progress_s=0.5)
    backend = {"name": "vertex_batch", "settings": {"sandbox": True}}
    spec = make_job(model="gemini-2.5-flash", backend=backend, canary_first=False)  # every shard offered at once
    with frozen_until_refused(vertex_sandbox):
        report = run_job(spec, instance, priced)
    assert_finished_once(spec, home, vertex_sandbox, report)
    refusals = refused(spec, home)
    assert refusals and {r["dimension"] for r in refusals} == {"jobs"}
    assert peak(vertex_sandbox, "vertex", "jobs") == 1


def test_bedrock_service_quota_waits_and_finishes(sandbox, make_job, instance, priced, home):
    sandbox.set_scenario("normal", min_records=10, quota_concurrent_jobs=1, in_progress_s=0.5)
    spec = make_job(
        model=BEDROCK_MODEL, backend={"name": "bedrock_batch", "settings": {"sandbox": True, "min_records": 10}}
    )
    report = run_job(spec, instance, priced)
    assert_finished_once(spec, home, sandbox, report)
    refusals = refused(spec, home)
    assert refusals and {r["code"] for r in refusals} == {"ServiceQuotaExceededException"}
    assert peak(sandbox, "bedrock", "jobs") == 1


def test_a_shard_bigger_than_the_whole_cap_is_sent_in_parts_and_finishes(
    sandbox, make_job, instance, resources, home, tmp_path
):
    probe = make_job("probe", shards={"max_requests": 40}, canary_first=False)
    run_job(probe, instance, {**resources, "store": type(resources["store"])(root=str(tmp_path / "probe"))})
    whole = sum(e["input_tokens"] for e in sandbox.ledger())
    sandbox.reset()
    cap = whole * 2 // 5  # the shard's tokens are 2.5 caps
    sandbox.set_scenario("normal", quota_enqueued_tokens=cap, in_progress_s=0.3)
    spec = make_job(
        shards={"max_requests": 40},
        canary_first=False,
        backend={"name": "openai_batch", "settings": {"sandbox": True, "quota": {"enqueued_tokens": cap}}},
    )
    assert len(Manifest(probe.name, Store(tmp_path / "probe")).shard_ids()) == 1
    report = run_job(spec, instance, resources)
    assert_finished_once(spec, home, sandbox, report)
    shard = Manifest(spec.name, Store(home)).shard_ids()[0]
    sent = [len(a.request_ids) for a in AttemptLog(Store(home), spec.name, shard).all() if a.submitted]
    assert len(sent) >= 3 and sum(sent) == report["succeeded"]  # one partition, parts that each fit
    assert sandbox.load()["refusals"] == 0 and 0 < peak(sandbox, "openai", "tokens") <= cap
