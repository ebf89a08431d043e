"""The demo job on ``vertex_batch`` through Dagster: the real google-genai SDK (vertexai=True) against the
sandbox, inputs and predictions on a loopback GCS emulator. The validated table, report and reconciliation;
partial results (JOB_STATE_PARTIALLY_SUCCEEDED) kept and the rest sent again; a crash between create and record
re-attaches (no second job); a systemic error (PERMISSION_DENIED) stops the job once and it resumes after the fix."""

import os
from collections import Counter
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
import yaml

from batch_pipeline.core.ledger.control import JobControl
from batch_pipeline.core.ledger.reconcile import VALID, check_invariant
from batch_pipeline.core.manifest.shards import Manifest
from batch_pipeline.core.publish.tables import JobState
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline.defs.pipeline import run_job
from batch_pipeline.defs.resources import PricesResource
from batch_pipeline_tests.gcs_fixtures import vertex_creates

from .conftest import REPO, ledger_ids
from .test_pipeline import materialize_partition, prepare

BACKEND = {"name": "vertex_batch", "settings": {"sandbox": True}}
MODEL = "gemini-2.5-flash"
# a price row for the test (data/prices.yaml is another helper's): Gemini 2.5 Flash on Vertex, USD per MTok
PRICE = {
    "input_per_mtok": 0.30,
    "cached_input_per_mtok": 0.03,
    "output_per_mtok": 2.50,
    "batch_discount": 0.5,
    "checked": "2026-12-01",
}


@pytest.fixture
def prices(tmp_path) -> Path:
    table = yaml.safe_load((REPO / "data" / "prices.yaml").read_text())
    table["prices"].setdefault("vertex_batch", {}).setdefault(MODEL, PRICE)
    path = tmp_path / "prices.yaml"
    path.write_text(yaml.safe_dump(table))
    return path


@pytest.fixture
def vresources(resources, prices) -> dict:
    return {**resources, "prices": PricesResource(path=str(prices))}


def spec_for(make_job, **overrides):
    return make_job(**{"backend": BACKEND, "model": MODEL, **overrides})


def jobs_listed(admin) -> int:
    """Batch prediction jobs the sandbox holds (whatever their create calls were answered)."""
    from google import genai
    from google.oauth2.credentials import Credentials

    client = genai.Client(
        vertexai=True,
        project="sandbox-project",
        location="us-central1",
        credentials=Credentials(token="t"),
        http_options={"base_url": admin.base_url},
    )
    return len(list(client.batches.list(config={"page_size": 100})))


def test_demo_job_on_vertex_gives_the_validated_table_report_and_reconciliation(
    vertex_sandbox, instance, vresources, home, make_job
):
    spec = spec_for(make_job)
    report = run_job(spec, instance, vresources)
    store = Store(home)
    rows = pl.from_arrow(Manifest(spec.name, store).rows())
    unique = rows["request_id"].n_unique()
    assert report["complete"] and report["succeeded"] == unique and report["dead_lettered"] == 0
    validated = pl.read_parquet(store.read_bytes(JobPaths(spec.name).validated))
    assert validated.height == rows.height and set(validated["output"]) <= set(spec.output.choice)
    state = JobState.load(spec, store)
    assert set(state.results["backend"]) == {"vertex_batch"} and state.results["cost_usd"].sum() > 0
    counts = check_invariant(state.items, state.results, state.states)  # raises on any gap
    assert counts.valid == unique and counts.expected == unique
    ledger = vertex_sandbox.ledger()
    assert {e["provider"] for e in ledger} == {"vertex"} and {e["model"] for e in ledger} == {MODEL}
    billed = Counter(ledger_ids(vertex_sandbox))
    assert set(billed) == set(rows["request_id"]) and set(billed.values()) == {1}
    shards = len(Manifest(spec.name, store).shard_ids())
    assert vertex_creates(vertex_sandbox) == shards  # one job per shard (the canary rides in its shard's job)
    # billed tokens are the ones stored
    assert state.results["input_tokens"].sum() == sum(e["input_tokens"] for e in ledger)
    again = run_job(spec, instance, vresources)  # a finished job run again sends nothing
    assert again["complete"] and vertex_creates(vertex_sandbox) == shards


def test_partially_succeeded_keeps_what_came_back_and_the_rest_goes_in_the_next_attempt(
    vertex_sandbox, instance, vresources, home, make_job
):
    spec = spec_for(make_job)
    shards = prepare(spec, instance, vresources)
    vertex_sandbox.set_scenario("partial", complete_share=0.5)
    materialize_partition(spec, instance, vresources, shards[0])
    store = Store(home)
    states = JobState.load(spec, store).states.filter(pl.col("shard_id") == shards[0])
    kept = states.filter(pl.col("state") == VALID).height
    assert 0 < kept < states.height
    assert states.filter(pl.col("state") != VALID)["failures"].max() == 0  # a request never run spends no budget
    vertex_sandbox.set_scenario("normal")
    materialize_partition(spec, instance, vresources, shards[0])
    states = JobState.load(spec, store).states.filter(pl.col("shard_id") == shards[0])
    assert states.filter(pl.col("state") == VALID).height == states.height
    billed = Counter(ledger_ids(vertex_sandbox))
    assert len(billed) == states.height and set(billed.values()) == {1}


def test_a_crash_between_create_and_record_reattaches_without_a_second_job(
    vertex_sandbox, vertex_sandbox_proc, make_job, home, tmp_path, prices, cli
):
    spec = spec_for(make_job)
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    env = {
        **os.environ,
        "DAGSTER_HOME": str(dagster_home),
        "BATCH_PIPELINE_SANDBOX_URL": vertex_sandbox_proc[1],
        "BATCH_PIPELINE_PRICES": str(prices),
    }
    cmd = ["run", spec.source_path, "--home", str(home)]
    crashed = cli.run(cmd, env={**env, "BATCH_PIPELINE_CRASH_AT": "after_create"}, timeout=240)
    assert crashed.returncode != 0, crashed.stdout + crashed.stderr
    assert vertex_creates(vertex_sandbox) == 1 == jobs_listed(vertex_sandbox)  # created, never recorded
    done = cli.run(cmd, env=env, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    shards = Manifest(spec.name, Store(home)).shard_ids()
    assert vertex_creates(vertex_sandbox) == len(shards) == jobs_listed(vertex_sandbox)  # re-attached
    billed = Counter(ledger_ids(vertex_sandbox))
    assert len(billed) == 40 and set(billed.values()) == {1}


def test_permission_denied_stops_the_job_once_and_it_resumes_after_the_fix(
    vertex_sandbox, instance, vresources, home, make_job, monkeypatch
):
    spec = spec_for(make_job)
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "denied-project")
    with pytest.raises(dg.Failure) as failure:
        run_job(spec, instance, vresources)
    message = failure.value.description
    assert "403" in message and "PERMISSION_DENIED" in message
    creates = [r for r in vertex_sandbox.requests() if r["method"] == "POST" and "batchPredictionJobs" in r["path"]]
    assert [r["status"] for r in creates] == [403]  # one failed submission, not one per shard or retry
    store = Store(home)
    stop = JobControl(store, spec.name).current()
    assert stop is not None and "PERMISSION_DENIED" in stop.reason
    assert vertex_sandbox.ledger() == []
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "granted-project")
    JobControl(store, spec.name).clear()
    report = run_job(spec, instance, vresources)
    assert report["complete"] and report["dead_lettered"] == 0


def test_the_plain_sandbox_starts_its_own_gcs_emulator_and_tells_the_executor(
    sandbox, instance, vresources, home, make_job, monkeypatch
):
    """No $STORAGE_EMULATOR_HOST anywhere (as in `batch-pipeline run` on a fresh machine): the sandbox starts an
    in-memory emulator on first use, the executor asks it where (GET /_sandbox/gcs), and both use the same one."""
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.delenv("BATCH_PIPELINE_SANDBOX_GCS_URL", raising=False)
    spec = spec_for(
        make_job,
        rows=[{"ticket_id": f"T{i}", "subject": "s", "body": f"My invoice {i} was charged twice."} for i in range(20)],
        canary={"max_failure_rate": 1.0},
        # retention keep: a collected job's GCS objects would be deleted, and the test reads them
        backend={**BACKEND, "settings": {**BACKEND["settings"], "retention": "keep"}},
    )
    report = run_job(spec, instance, vresources)
    assert report["complete"] and report["succeeded"] == 20
    import json
    import urllib.request

    with urllib.request.urlopen(sandbox.base_url + "/_sandbox/gcs") as answer:
        url = json.loads(answer.read())["gcs_endpoint_url"]
    assert url.startswith("http://127.0.0.1:")
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    client = storage.Client(project="sandbox", credentials=AnonymousCredentials(), client_options={"api_endpoint": url})
    names = [b.name for b in client.list_blobs("batch-pipeline-sandbox")]
    assert any(n.endswith("input.jsonl") for n in names) and any("predictions" in n for n in names)
