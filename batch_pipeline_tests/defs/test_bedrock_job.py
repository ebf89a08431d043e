"""The demo job on ``bedrock_batch`` through Dagster against the sandbox (Bedrock's control plane over its S3): the
validated table, report and reconciliation; shards below Bedrock's minimum never reach create_model_invocation_job
(they go to the tail backend, or wait and say why); a crash between create and record re-attaches; access denied
and an unknown model stop the job once; throttling is waited out; a timed-out job's leftovers go to the tail."""

import os
from collections import Counter

import dagster as dg
import polars as pl
import pytest
import yaml

from batch_pipeline.core.ledger.control import JobControl
from batch_pipeline.core.ledger.reconcile import check_invariant
from batch_pipeline.core.manifest.shards import Manifest
from batch_pipeline.core.publish.tables import JobState
from batch_pipeline.core.spec.loading import load_spec
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.state.view import load_view
from batch_pipeline.core.store import Store
from batch_pipeline.defs.pipeline import run_job
from batch_pipeline.defs.resources import PricesResource, StoreResource
from batch_pipeline.executors.registry import batch_minimum

from .conftest import REPO, ledger_ids

MODEL = "anthropic.claude-3-5-haiku-20241022-v1:0"
SMALL_JOB = {"name": "bedrock_batch", "settings": {"sandbox": True, "min_records": 10}}
TAIL = {"backend": {"name": "online", "settings": {"sandbox": True}}}
# a price row for the Claude model on Bedrock and online (the tail), unless data/prices.yaml has one already
ROW = {"input_per_mtok": 0.80, "cached_input_per_mtok": 0.08, "output_per_mtok": 4.00, "checked": "2026-12-01"}


@pytest.fixture
def resources(home, tmp_path) -> dict:
    table = yaml.safe_load((REPO / "data" / "prices.yaml").read_text())
    for backend, discount in (("bedrock_batch", 0.5), ("online", 0.0)):
        table["prices"].setdefault(backend, {}).setdefault(MODEL, {**ROW, "batch_discount": discount})
    path = tmp_path / "prices.yaml"
    path.write_text(yaml.safe_dump(table))
    return {"store": StoreResource(root=str(home)), "prices": PricesResource(path=str(path))}


def creates(admin) -> list[dict]:
    return [r for r in admin.requests() if r["method"] == "POST" and r["path"] == "/model-invocation-job"]


def small_job(make_job, sandbox, **overrides):
    """40 tickets in shards of 10, on an account whose minimum is 10 records per job (the sandbox's too)."""
    sandbox.set_scenario("normal", min_records=10)
    return make_job(backend=SMALL_JOB, model=MODEL, **overrides)


def test_demo_job_on_bedrock_gives_the_validated_table_report_and_reconciliation(
    sandbox, instance, resources, home, tmp_path
):
    demo = yaml.safe_load((REPO / "data" / "jobs" / "demo.yaml").read_text())
    demo.update(backend={"name": "bedrock_batch", "settings": {"sandbox": True}}, model=MODEL)
    demo["input"]["path"] = str(REPO / demo["input"]["path"])
    demo["quality"]["golden"] = str(REPO / demo["quality"]["golden"])
    path = tmp_path / "demo.yaml"
    path.write_text(yaml.safe_dump(demo))
    spec = load_spec(path)
    report = run_job(spec, instance, resources)
    store = Store(home)
    rows = pl.from_arrow(Manifest(spec.name, store).rows())
    unique = rows["request_id"].n_unique()
    assert report["complete"] and report["succeeded"] == unique and report["dead_lettered"] == 0
    validated = pl.read_parquet(store.read_bytes(JobPaths(spec.name).validated))
    assert validated.height == rows.height and set(validated["output"]) <= set(spec.output.choice)
    state = JobState.load(spec, store)
    assert set(state.results["backend"]) == {"bedrock_batch"} and state.results["cost_usd"].sum() > 0
    counts = check_invariant(state.items, state.results, state.states)  # raises on any gap
    assert counts.valid == unique == counts.expected
    bedrock = [e for e in sandbox.ledger() if e.get("provider") == "bedrock"]
    assert {e["model"] for e in bedrock} == {MODEL}
    billed = Counter(e["custom_id"] for e in bedrock)
    assert set(rows["request_id"]) <= set(billed) and set(billed.values()) == {1}  # items and golden probes, once
    shards = Manifest(spec.name, store).shard_ids()
    assert len(creates(sandbox)) == len(shards) + 1  # the canary sample is its own job, then the rest of its shard
    assert all(c["status"] == 200 for c in creates(sandbox))


def test_shards_below_the_minimum_never_reach_create_they_go_to_the_tail(sandbox, instance, resources, home, make_job):
    spec = make_job(backend={"name": "bedrock_batch", "settings": {"sandbox": True}}, model=MODEL, tail=TAIL)
    assert batch_minimum(spec.backend) == 100  # Bedrock's default quota; the shards hold 10
    report = run_job(spec, instance, resources)
    assert report["complete"] and report["succeeded"] == 40
    assert creates(sandbox) == []
    assert not [r for r in sandbox.requests() if r["path"].startswith("/model-invocation-job")]
    state = JobState.load(spec, Store(home))
    assert set(state.results["backend"]) == {"online"}  # each shard went online, at the online price
    assert len(sandbox.ledger()) == 40 and {e.get("mode") for e in sandbox.ledger()} == {"online"}


def test_without_a_tail_a_shard_below_the_minimum_waits_and_says_why(sandbox, instance, resources, home, make_job):
    spec = make_job(backend={"name": "bedrock_batch", "settings": {"sandbox": True}}, model=MODEL)
    report = run_job(spec, instance, resources)
    assert not report["complete"] and creates(sandbox) == [] and sandbox.ledger() == []
    plan = load_view(spec, Store(home), min_batch=batch_minimum(spec.backend)).plan()
    canary = Manifest(spec.name, Store(home)).shard_ids()[0]
    assert plan.waiting[canary].startswith(
        "the canary sample has 10 item(s), below the backend's minimum of 100 per batch; it waits (a `tail:` backend"
    )
    assert "4 shard(s) wait" not in plan.describe() and "below the backend's minimum" in plan.describe()


def test_a_crash_between_create_and_record_reattaches_without_a_second_job(
    sandbox, sandbox_proc, make_job, home, tmp_path, resources, cli
):
    spec = small_job(make_job, sandbox)
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    env = {
        **os.environ,
        "DAGSTER_HOME": str(dagster_home),
        "BATCH_PIPELINE_SANDBOX_URL": sandbox_proc[1],
        "BATCH_PIPELINE_PRICES": resources["prices"].path,
    }
    cmd = ["run", spec.source_path, "--home", str(home)]
    crashed = cli.run(cmd, env={**env, "BATCH_PIPELINE_CRASH_AT": "after_create"}, timeout=240)
    assert crashed.returncode != 0
    assert len(creates(sandbox)) == 1  # Bedrock has the canary's job; we never recorded it
    done = cli.run(cmd, env=env, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    shards = Manifest(spec.name, Store(home)).shard_ids()
    assert len(creates(sandbox)) == len(shards)  # re-attached by name: no second job for the crashed shard
    billed = Counter(ledger_ids(sandbox))
    assert len(billed) == 40 and set(billed.values()) == {1}


@pytest.mark.parametrize(
    ("scenario", "status", "words"),
    [("access_denied", 403, "AccessDeniedException"), ("unknown_model", 400, "model identifier is invalid")],
)
def test_access_denied_or_an_unknown_model_stops_the_job_once(
    sandbox, instance, resources, home, make_job, scenario, status, words
):
    spec = small_job(make_job, sandbox)
    sandbox.set_scenario(scenario, min_records=10)
    with pytest.raises(dg.Failure) as failure:
        run_job(spec, instance, resources)
    assert words in failure.value.description and "sandbox-secret" not in failure.value.description
    assert [c["status"] for c in creates(sandbox)] == [status]  # one failed create, not one per shard
    store = Store(home)
    stop = JobControl(store, spec.name).current()
    assert stop is not None and words in stop.reason and sandbox.ledger() == []
    sandbox.set_scenario("normal", min_records=10)  # the fix, then a resume
    JobControl(store, spec.name).clear()
    report = run_job(spec, instance, resources)
    assert report["complete"] and report["succeeded"] == 40


def test_throttling_is_honoured(sandbox, instance, resources, home, make_job):
    spec = small_job(make_job, sandbox)
    sandbox.set_scenario(
        "rate_limit", on=["bedrock_create", "bedrock_get", "bedrock_list"], times=2, retry_after_ms=20, min_records=10
    )
    report = run_job(spec, instance, resources)
    assert report["complete"] and report["succeeded"] == 40
    statuses = [c["status"] for c in creates(sandbox)]
    assert statuses.count(429) == 2 and statuses.count(200) == len(Manifest(spec.name, Store(home)).shard_ids())
    assert set(Counter(ledger_ids(sandbox)).values()) == {1}


def test_a_partially_completed_job_keeps_its_results_and_the_rest_goes_to_the_tail(
    sandbox, instance, resources, home, make_job
):
    spec = small_job(make_job, sandbox, tail=TAIL)
    sandbox.set_scenario("expire", complete_share=0.5, min_records=10)
    report = run_job(spec, instance, resources)
    assert report["complete"] and report["succeeded"] == 40
    results = JobState.load(spec, Store(home)).results
    by_backend = dict(results.group_by("backend").len().iter_rows())
    assert by_backend["bedrock_batch"] > 0 and by_backend["online"] > 0  # the 5 of each 10 never processed
    billed = Counter(e["custom_id"] for e in sandbox.ledger() if e.get("provider") == "bedrock")
    assert set(billed.values()) == {1} and len(billed) == by_backend["bedrock_batch"]
    assert len(sandbox.ledger()) == 40  # online ones included: nothing paid twice
