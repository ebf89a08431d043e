"""Provider-side data hygiene through whole jobs (Dagster, the real SDKs, the sandbox process; Vertex's GCS is the
loopback emulator, Bedrock's S3 the sandbox's own): with ``retention: delete`` (the default) the sandbox holds none
of the job's files, batches or objects afterwards, listed through each provider's SDK; with ``keep`` it holds all of
them. A run SIGKILLed between storing a shard's results and deleting its files leaves them; the next run deletes
them and bills nothing twice."""

import os
import signal
from collections import Counter

import dagster as dg
import pytest

from batch_pipeline.core.ledger.attempts import Attempt, AttemptLog
from batch_pipeline.core.manifest.shards import Manifest
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.store import Store
from batch_pipeline.defs.pipeline import run_job
from batch_pipeline.executors.registry import create_executor

from .conftest import ledger_ids
from .test_fault_campaign import _finish_by_sensors

PROVIDERS = {
    "openai": ("openai_batch", "gpt-4o-mini", {}),
    "anthropic": ("anthropic_batch", "claude-haiku-4-5", {}),
    "gemini": ("gemini_batch", "gemini-2.5-flash", {}),
    "vertex": ("vertex_batch", "gemini-2.5-flash", {}),
    "bedrock": ("bedrock_batch", "anthropic.claude-3-5-haiku-20241022-v1:0", {"min_records": 10}),
}


@pytest.fixture
def provider_sandbox(vertex_sandbox, monkeypatch):
    """One sandbox process for every provider (it knows the GCS emulator), reset, with no real key in reach; its
    Bedrock account takes jobs of 10 records (the shards hold 10)."""
    for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(key, raising=False)
    vertex_sandbox.set_scenario("normal", min_records=10)
    return vertex_sandbox


def job_for(make_job, provider: str, retention: str | None = None, **overrides) -> JobSpec:
    name, model, extra = PROVIDERS[provider]
    settings = {"sandbox": True, **extra, **({"retention": retention} if retention else {})}
    return make_job(name=f"h_{provider}", backend={"name": name, "settings": settings}, model=model, **overrides)


def holdings(spec: JobSpec) -> set[str]:
    """What the provider holds for the job, listed through its own SDK (the sandbox serves this job alone)."""
    ex = create_executor(spec.backend)
    name = spec.backend.name
    if name == "openai_batch":
        return {f.id for f in ex.client.files.list()}
    if name == "anthropic_batch":
        return {b.id for b in ex.client.messages.batches.list(limit=100)}
    if name == "gemini_batch":
        return {str(f.name) for f in ex.client.files.list(config={"page_size": 100})} | {
            str(b.name) for b in ex.client.batches.list(config={"page_size": 100})
        }
    if name == "vertex_batch":
        prefix = f"{ex.settings.prefix}/{spec.name}/"
        return {f"gs://{ex.bucket}/{b.name}" for b in ex.gcs.client.list_blobs(ex.bucket, prefix=prefix)}
    assert name == "bedrock_batch"
    found = set()
    for where in ex.where:
        pages = ex.s3.get_paginator("list_objects_v2").paginate(Bucket=where.bucket, Prefix=where.key(spec.name) + "/")
        found |= {f"s3://{where.bucket}/{o['Key']}" for page in pages for o in page.get("Contents") or []}
    return found


def per_attempt(provider: str) -> int:
    """Objects an attempt leaves at least: Anthropic's batch (its results inside), else an input and its results."""
    return 1 if provider == "anthropic" else 2


def batch_attempts(spec: JobSpec, home) -> list[Attempt]:
    store = Store(home)
    return [
        a
        for sid in Manifest(spec.name, store).shard_ids()
        for a in AttemptLog(store, spec.name, sid).all()
        if a.submitted
    ]


def own_ids(attempt: Attempt) -> set[str]:
    """The ids an attempt's handle names at the provider (its batch, and the input it uploaded where recorded)."""
    handle = attempt.submitted
    assert handle is not None
    ids = {handle.batch_id, handle.input_file_id} - {None}
    if handle.backend in ("openai_batch", "vertex_batch", "bedrock_batch"):
        ids.discard(handle.batch_id)  # the batch (job) record stays at the provider: it holds no data
    return ids


@pytest.mark.parametrize("provider", list(PROVIDERS))
def test_after_a_job_with_retention_delete_the_provider_holds_none_of_its_data(
    provider, provider_sandbox, make_job, instance, resources, home
):
    spec = job_for(make_job, provider)
    report = run_job(spec, instance, resources)
    assert report["complete"] and report["succeeded"] == 40
    attempts = batch_attempts(spec, home)
    assert attempts and all("collected" in a.records and a.closed for a in attempts)
    assert holdings(spec) == set()
    for attempt in attempts:  # each recorded what it deleted, its own ids among them
        deleted = set(attempt.discarded.deleted)
        assert own_ids(attempt) <= deleted and len(deleted) >= per_attempt(provider), (attempt.number, deleted)


@pytest.mark.parametrize("provider", list(PROVIDERS))
def test_with_retention_keep_the_provider_holds_all_of_it(
    provider, provider_sandbox, make_job, instance, resources, home
):
    spec = job_for(make_job, provider, retention="keep")
    report = run_job(spec, instance, resources)
    assert report["complete"] and report["succeeded"] == 40
    attempts = batch_attempts(spec, home)
    assert attempts and not [a for a in attempts if "discarded" in a.records]
    held = holdings(spec)
    for attempt in attempts:
        assert own_ids(attempt) <= held, attempt.number
    assert len(held) >= per_attempt(provider) * len(attempts)


@pytest.mark.parametrize(("provider", "finish"), [("openai", "cli"), ("anthropic", "cli"), ("openai", "sensors")])
def test_a_kill_between_storing_and_deleting_is_cleaned_by_the_next_run_billing_nothing_twice(
    provider, finish, provider_sandbox, vertex_sandbox_proc, make_job, resources, home, tmp_path, cli
):
    # a canary sample smaller than its shard, as in the fault campaign: a kill after a canary that is the whole
    # shard was collected but before it was judged leaves the job waiting on it (the driver's, not this, to fix)
    spec = job_for(make_job, provider, canary={"size": 4})
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    env = {**os.environ, "DAGSTER_HOME": str(dagster_home), "BATCH_PIPELINE_SANDBOX_URL": vertex_sandbox_proc[1]}
    env.pop("BATCH_PIPELINE_CRASH_AT", None)
    cmd = ["run", spec.source_path, "--home", str(home)]
    killed = cli.run(cmd, env={**env, "BATCH_PIPELINE_CRASH_AT": "before_discard"}, timeout=240)
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    (stored,) = batch_attempts(spec, home)  # the canary's batch: its results stored, its data still there
    assert "collected" in stored.records and "discarded" not in stored.records
    assert own_ids(stored) <= holdings(spec)
    if finish == "cli":
        done = cli.run(cmd, env=env, timeout=240)
        assert done.returncode == 0, done.stdout + done.stderr
    else:  # the daemon's way: the shard sensor's runs, up to its publish run, on the killed run's instance
        with dg.DagsterInstance.from_config(str(dagster_home)) as shared:
            _finish_by_sensors(spec, shared, resources)
    assert holdings(spec) == set()
    attempts = batch_attempts(spec, home)
    assert all("discarded" in a.records for a in attempts)
    assert own_ids(stored) <= set(
        AttemptLog(Store(home), spec.name, stored.key.split(":")[1]).all()[0].discarded.deleted
    )  # deleted by the next run's sweep
    billed = Counter(ledger_ids(provider_sandbox))
    assert len(billed) == 40 and set(billed.values()) == {1}
