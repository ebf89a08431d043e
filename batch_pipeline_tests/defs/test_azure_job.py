"""The demo job on ``azure_openai_batch`` through Dagster against the sandbox's Azure shape: the validated table,
report and reconciliation; a crash between create and record re-attaches (one Azure batch per shard); a bad key
stops the job once."""

import os
from collections import Counter

import dagster as dg
import polars as pl
import pytest

from batch_pipeline.core.ledger.control import JobControl
from batch_pipeline.core.ledger.reconcile import check_invariant
from batch_pipeline.core.manifest.shards import Manifest
from batch_pipeline.core.publish.tables import JobState
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline.defs.pipeline import run_job

from .conftest import ledger_ids

BACKEND = {
    "name": "azure_openai_batch",
    "settings": {"sandbox": True, "deployments": {"gpt-4o-mini": "demo-4o-mini-batch"}},
}


@pytest.fixture(autouse=True)
def _no_azure_credentials(monkeypatch):
    for name in ("AZURE_OPENAI_API_KEY", "AZURE_OPENAI_AD_TOKEN", "AZURE_OPENAI_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)


def azure_creates(admin) -> list[dict]:
    return [r for r in admin.requests() if r["method"] == "POST" and r["path"] == "/openai/batches"]


def test_demo_job_on_azure_gives_the_validated_table_report_and_reconciliation(
    sandbox, instance, resources, home, make_job
):
    spec = make_job(backend=BACKEND)
    report = run_job(spec, instance, resources)
    store = Store(home)
    rows = pl.from_arrow(Manifest(spec.name, store).rows())
    unique = rows["request_id"].n_unique()
    assert report["complete"] and report["succeeded"] == unique and report["dead_lettered"] == 0
    validated = pl.read_parquet(store.read_bytes(JobPaths(spec.name).validated))
    assert validated.height == rows.height and set(validated["output"]) <= set(spec.output.choice)
    state = JobState.load(spec, store)
    assert set(state.results["backend"]) == {"azure_openai_batch"} and state.results["cost_usd"].sum() > 0
    counts = check_invariant(state.items, state.results, state.states)  # raises on any gap
    assert counts.valid == unique and counts.expected == unique
    ledger = sandbox.ledger()
    assert {e["provider"] for e in ledger} == {"azure_openai"} and {e["model"] for e in ledger} == {
        "demo-4o-mini-batch"
    }
    billed = Counter(ledger_ids(sandbox))
    assert set(billed) == set(rows["request_id"]) and set(billed.values()) == {1}
    assert len(azure_creates(sandbox)) == len(Manifest(spec.name, store).shard_ids())
    assert not [r for r in sandbox.requests() if r["path"].startswith("/v1/batches")]


def test_a_crash_between_create_and_record_reattaches_without_a_second_azure_batch(
    sandbox, sandbox_proc, make_job, home, tmp_path, cli
):
    spec = make_job(backend=BACKEND)
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    env = {**os.environ, "DAGSTER_HOME": str(dagster_home), "BATCH_PIPELINE_SANDBOX_URL": sandbox_proc[1]}
    cmd = ["run", spec.source_path, "--home", str(home)]
    crashed = cli.run(cmd, env={**env, "BATCH_PIPELINE_CRASH_AT": "after_create"}, timeout=240)
    assert crashed.returncode != 0
    assert len(azure_creates(sandbox)) == 1  # the provider has the canary's batch; we never recorded it
    done = cli.run(cmd, env=env, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    shards = Manifest(spec.name, Store(home)).shard_ids()
    assert len(azure_creates(sandbox)) == len(shards)  # re-attached: no second batch for the crashed shard
    billed = Counter(ledger_ids(sandbox))
    assert len(billed) == 40 and set(billed.values()) == {1}


def test_a_bad_azure_key_stops_the_job_once(sandbox, instance, resources, home, make_job, monkeypatch):
    spec = make_job(backend=BACKEND)
    monkeypatch.setenv("AZURE_OPENAI_API_KEY", "sk-sandbox-bad")
    with pytest.raises(dg.Failure) as failure:
        run_job(spec, instance, resources)
    message = failure.value.description
    assert "401" in message and "Azure OpenAI" in message and "sk-sandbox-bad" not in message
    uploads = [r for r in sandbox.requests() if r["path"] == "/openai/files" and r["method"] == "POST"]
    assert len(uploads) == 1 and uploads[0]["status"] == 401  # one failed submission, not one per shard
    store = Store(home)
    stop = JobControl(store, spec.name).current()
    assert stop is not None and "401" in stop.reason
    assert sandbox.ledger() == []
    monkeypatch.setenv("AZURE_OPENAI_API_KEY", "good-key")
    JobControl(store, spec.name).clear()
    report = run_job(spec, instance, resources)
    assert report["complete"] and report["dead_lettered"] == 0
