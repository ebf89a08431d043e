"""The demo job on ``gemini_batch`` through Dagster against the sandbox's Gemini API (real google-genai SDK): the
validated table, report and reconciliation; Gemini's no-results expiry sends every item once more; a crash between
create and record re-attaches (one batch per shard); a bad key stops the job once."""

import os
from collections import Counter

import dagster as dg
import polars as pl
import pytest
import yaml

from batch_pipeline.core.ledger.attempts import AttemptLog
from batch_pipeline.core.ledger.control import JobControl
from batch_pipeline.core.ledger.reconcile import VALID, check_invariant
from batch_pipeline.core.manifest.shards import Manifest
from batch_pipeline.core.publish.tables import JobState
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline.defs.pipeline import run_job
from batch_pipeline.defs.resources import PricesResource

from .conftest import REPO, ledger_ids
from .test_pipeline import materialize_partition, prepare

MODEL = "gemini-2.5-flash"
BACKEND = {"name": "gemini_batch", "settings": {"sandbox": True}}
# used only when data/prices.yaml has no gemini_batch row for the model (another change adds the real rows)
FALLBACK_PRICE = {
    "input_per_mtok": 0.30,
    "cached_input_per_mtok": 0.03,
    "output_per_mtok": 2.50,
    "batch_discount": 0.5,
    "checked": "2026-12-01",
}


@pytest.fixture(autouse=True)
def _no_google_keys(monkeypatch):
    for name in ("GEMINI_API_KEY", "GOOGLE_API_KEY", "GOOGLE_GENAI_API_VERSION", "GOOGLE_GEMINI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def prices(tmp_path, monkeypatch) -> str:
    table = yaml.safe_load((REPO / "data" / "prices.yaml").read_text())
    table["prices"].setdefault("gemini_batch", {}).setdefault(MODEL, FALLBACK_PRICE)
    path = tmp_path / "prices.yaml"
    path.write_text(yaml.safe_dump(table))
    monkeypatch.setenv("BATCH_PIPELINE_PRICES", str(path))
    return str(path)


@pytest.fixture
def gemini_resources(resources, prices) -> dict:
    return {**resources, "prices": PricesResource(path=prices)}


def gemini_job(make_job, **overrides):
    return make_job(model=MODEL, backend=BACKEND, **overrides)


def creates(admin) -> list[dict]:
    return [
        r
        for r in admin.requests()
        if r["method"] == "POST" and r["path"].endswith(":batchGenerateContent") and r["status"] == 200
    ]


def test_demo_job_on_gemini_gives_the_validated_table_report_and_reconciliation(
    sandbox, instance, gemini_resources, home, make_job, prices
):
    spec = gemini_job(make_job)
    report = run_job(spec, instance, gemini_resources)
    store = Store(home)
    rows = pl.from_arrow(Manifest(spec.name, store).rows())
    unique = rows["request_id"].n_unique()
    assert report["complete"] and report["succeeded"] == unique and report["dead_lettered"] == 0
    validated = pl.read_parquet(store.read_bytes(JobPaths(spec.name).validated))
    assert validated.height == rows.height and set(validated["output"]) <= set(spec.output.choice)
    state = JobState.load(spec, store)
    assert set(state.results["backend"]) == {"gemini_batch"}
    counts = check_invariant(state.items, state.results, state.states)  # raises on any gap
    assert counts.valid == unique and counts.expected == unique
    ledger = sandbox.ledger()
    assert {e["provider"] for e in ledger} == {"gemini"} and {e["model"] for e in ledger} == {MODEL}
    billed = Counter(ledger_ids(sandbox))
    assert set(billed) == set(rows["request_id"]) and set(billed.values()) == {1}
    price = yaml.safe_load(open(prices))["prices"]["gemini_batch"][MODEL]
    tin, cached, out = (sum(e[k] for e in ledger) for k in ("input_tokens", "cached_tokens", "output_tokens"))
    by_hand = (
        (
            (tin - cached) * price["input_per_mtok"]
            + cached * price["cached_input_per_mtok"]
            + out * price["output_per_mtok"]
        )
        / 1e6
        * (1 - price["batch_discount"])
    )
    assert float(state.results["cost_usd"].sum()) == pytest.approx(by_hand, rel=1e-9)
    assert len(creates(sandbox)) == len(Manifest(spec.name, store).shard_ids())  # one batch per shard
    assert not [r for r in sandbox.requests() if r["path"].startswith("/v1/batches") and r["method"] == "POST"]


def test_an_expired_gemini_batch_returns_nothing_and_every_item_goes_once_more(
    sandbox, instance, gemini_resources, home, make_job
):
    spec = gemini_job(make_job)
    shards = prepare(spec, instance, gemini_resources)
    sandbox.set_scenario("expire", complete_share=0.9)  # most requests were answered: Gemini still returns none
    materialize_partition(spec, instance, gemini_resources, shards[0])
    store = Store(home)
    states = JobState.load(spec, store).states.filter(pl.col("shard_id") == shards[0])
    assert states.height > 0 and states.filter(pl.col("state") == VALID).height == 0
    assert states["failures"].max() == 0  # expiry spends no item's budget
    assert sandbox.ledger() == []
    sandbox.set_scenario("normal")
    materialize_partition(spec, instance, gemini_resources, shards[0])
    states = JobState.load(spec, store).states.filter(pl.col("shard_id") == shards[0])
    assert states.filter(pl.col("state") == VALID).height == states.height
    attempts = AttemptLog(store, spec.name, shards[0]).all()
    assert len(attempts) == 2 and set(attempts[1].request_ids) == set(attempts[0].request_ids)  # all, once more
    billed = Counter(ledger_ids(sandbox))
    assert len(billed) == states.height and set(billed.values()) == {1}


def test_a_crash_between_create_and_record_reattaches_without_a_second_gemini_batch(
    sandbox, sandbox_proc, make_job, home, tmp_path, prices, cli
):
    spec = gemini_job(make_job)
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    env = {**os.environ, "DAGSTER_HOME": str(dagster_home), "BATCH_PIPELINE_SANDBOX_URL": sandbox_proc[1]}
    cmd = ["run", spec.source_path, "--home", str(home)]
    crashed = cli.run(cmd, env={**env, "BATCH_PIPELINE_CRASH_AT": "after_create"}, timeout=240)
    assert crashed.returncode != 0
    assert len(creates(sandbox)) == 1  # Google has the canary's batch; we never recorded it
    done = cli.run(cmd, env=env, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    shards = Manifest(spec.name, Store(home)).shard_ids()
    assert len(creates(sandbox)) == len(shards)  # re-attached: no second batch for the crashed one
    billed = Counter(ledger_ids(sandbox))
    assert len(billed) == 40 and set(billed.values()) == {1}


def test_a_bad_gemini_key_stops_the_job_once(sandbox, instance, gemini_resources, home, make_job, monkeypatch):
    spec = gemini_job(make_job)
    monkeypatch.setenv("GEMINI_API_KEY", "sk-sandbox-bad")
    with pytest.raises(dg.Failure) as failure:
        run_job(spec, instance, gemini_resources)
    message = failure.value.description
    assert "API key not valid" in message and "sk-sandbox-bad" not in message
    uploads = [r for r in sandbox.requests() if r["path"].startswith("/upload/") and r["method"] == "POST"]
    assert len(uploads) == 1 and uploads[0]["status"] == 400  # one failed submission, not one per shard
    store = Store(home)
    stop = JobControl(store, spec.name).current()
    assert stop is not None and "API key not valid" in stop.reason
    assert sandbox.ledger() == []
    monkeypatch.setenv("GEMINI_API_KEY", "good-key")
    JobControl(store, spec.name).clear()
    report = run_job(spec, instance, gemini_resources)
    assert report["complete"] and report["dead_lettered"] == 0
