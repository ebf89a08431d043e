"""Whole jobs through Dagster's materialize() on the sandbox: accounting, resume, retries, dead letters."""

import json
from collections import Counter

import dagster as dg
import polars as pl
import pytest

from batch_pipeline.core.ledger.attempts import AttemptLog
from batch_pipeline.core.ledger.reconcile import DEAD, VALID
from batch_pipeline.core.manifest.shards import Manifest
from batch_pipeline.core.publish.tables import JobState
from batch_pipeline.core.quality.golden import GoldenProbes
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline.defs.assets import asset_key
from batch_pipeline.defs.build import build_definitions
from batch_pipeline.defs.pipeline import run_job

from .conftest import REPO, batch_creates, ledger_ids


def materialize_partition(spec, instance, resources, shard: str) -> dg.ExecuteInProcessResult:
    defs = build_definitions([spec], resources)
    return dg.materialize(
        [*defs.assets, *defs.asset_checks],
        selection=[asset_key(spec, "submissions"), asset_key(spec, "shard_results")],
        partition_key=shard,
        instance=instance,
        resources=defs.resources,
    )


def prepare(spec, instance, resources) -> list[str]:
    defs = build_definitions([spec], resources)
    dg.materialize(
        [*defs.assets, *defs.asset_checks],
        selection=[asset_key(spec, "manifest"), asset_key(spec, "quote")],
        instance=instance,
        resources=defs.resources,
    )
    return instance.get_dynamic_partitions(f"{spec.name}_shards")


def test_demo_job_accounts_for_every_item_and_a_rerun_sends_nothing(sandbox, instance, resources, home):
    from batch_pipeline.core.spec.loading import load_spec

    spec = load_spec(REPO / "data" / "jobs" / "demo.yaml")
    report = run_job(spec, instance, resources)
    store = Store(home)
    rows = pl.from_arrow(Manifest("demo", store).rows())
    unique = rows["request_id"].n_unique()
    assert report["complete"] and report["unique_requests"] == unique
    assert report["succeeded"] == unique and report["dead_lettered"] == 0
    assert report["input_rows"] == rows.height + report["rejected_rows"]
    assert report["duplicates_collapsed"] == rows.height - unique > 0
    # every source row is answered; duplicates were paid once
    validated = pl.read_parquet(store.read_bytes(JobPaths("demo").validated))
    assert validated.height == rows.height
    assert set(validated["output"]) <= set(spec.output.choice)
    billed = Counter(ledger_ids(sandbox))
    probes = JobState.load(spec, store).probe_results
    assert probes is not None and probes.height >= 60  # every golden record rode in the canary shard
    assert max(billed.values()) == 1 and len(billed) == unique + probes.height
    assert set(billed) == set(rows["request_id"]) | set(probes["request_id"])
    paid_for_items = float(JobState.load(spec, store).results["cost_usd"].sum())
    assert validated["cost_usd"].sum() == pytest.approx(paid_for_items, abs=1e-6)
    creates = batch_creates(sandbox)
    assert creates == report["shards"] + 1  # the canary sample is its own small batch, then the rest of its shard
    canary = AttemptLog(store, "demo", "s00001").all()[0]
    golden = GoldenProbes(spec, store).for_shard("s00001", 0, canary=True).height  # every golden record rides in it
    assert canary.canary and len(canary.request_ids) == spec.canary.size + golden
    # a finished job run again sends zero requests
    again = run_job(spec, instance, resources)
    assert again["complete"] and len(sandbox.ledger()) == len(billed) and batch_creates(sandbox) == creates
    # the demo materializes every asset of its graph: backend_comparison (cost_compare) is made with the manifest
    defs = build_definitions([spec], resources)
    keys = {k for a in defs.assets for k in a.keys if k.path[0] == "demo"} - {asset_key(spec, "eval")}  # weekly
    assert asset_key(spec, "backend_comparison") in keys
    assert [k for k in keys if instance.get_latest_materialization_event(k) is None] == []
    rows = store.read_json(f"{JobPaths('demo').root}/backend_comparison.json")
    assert {r["backend"] for r in rows} >= {"openai_batch", "online", "anthropic_batch", "self_hosted"}


def _stage_of(instance: dg.DagsterInstance, run: dg.DagsterRun) -> str:
    planned = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED)
    names = sorted({e.dagster_event.asset_key.path[-1] for e in planned})
    return "shards" if "submissions" in names else "+".join(names)


def test_each_spend_follows_a_fresh_quote_and_no_quote_is_taken_twice_in_a_row(sandbox, instance, resources, make_job):
    """The canary and each pass spend against a quote made after the last spend. A job never published takes its
    first quote in the manifest's run, as the sensors' prepare job does; a second one, with nothing spent between,
    would be one Dagster run more per job. Run again once published, the manifest runs alone, and the job quotes
    only when it has something to send (new rows here)."""
    spec = make_job(canary={"size": 4})
    assert run_job(spec, instance, resources)["complete"]
    stages = [_stage_of(instance, r) for r in reversed(instance.get_runs())]
    assert stages == [
        "backend_comparison+manifest+quote",
        "shards",
        "quote",
        "shards",
        "dead_letters+report+results+validated",
    ]
    before = len(stages)
    run_job(spec, instance, resources)  # nothing new: no quote
    again = [_stage_of(instance, r) for r in reversed(instance.get_runs())][before:]
    assert again == ["backend_comparison+manifest"], again
    with open(spec.input.path.replace("*.jsonl", "rows.jsonl"), "a") as f:
        row = {"ticket_id": "T999001", "subject": "Charge", "body": "My invoice shows a charge I do not recognise."}
        f.write(json.dumps(row) + "\n")
    before += len(again)
    assert run_job(spec, instance, resources)["complete"]
    grown = [_stage_of(instance, r) for r in reversed(instance.get_runs())][before:]
    assert grown[:3] == ["backend_comparison+manifest", "quote", "shards"], grown


def test_a_spec_without_cost_compare_has_no_comparison_asset_and_every_asset_is_in_a_job(make_job):
    for spec in (make_job(name="plain", cost_compare=None), make_job(name="compared")):
        defs = build_definitions([spec])
        keys = {k for a in defs.assets for k in a.keys if k.path[0] == spec.name}
        assert (asset_key(spec, "backend_comparison") in keys) == (spec.cost_compare is not None)
        in_jobs = {
            k
            for job in defs.resolve_all_job_defs()
            if job.name.startswith(f"{spec.name}_")
            for k in job.asset_layer.selected_asset_keys
        }
        assert keys - in_jobs == set(), keys - in_jobs  # no asset that no job (and so no run) materializes


def test_transient_line_errors_succeed_on_next_partition_materialization(sandbox, instance, resources, home, make_job):
    spec = make_job()
    shards = prepare(spec, instance, resources)
    sandbox.set_scenario("line_errors", rate=0.3, times=1)
    materialize_partition(spec, instance, resources, shards[0])
    state = JobState.load(spec, Store(home)).states.filter(pl.col("shard_id") == shards[0])
    failed_first = state.filter(pl.col("state") != VALID).height
    assert 0 < failed_first < state.height
    sent_before = len(sandbox.requests())
    materialize_partition(spec, instance, resources, shards[0])
    state = JobState.load(spec, Store(home)).states.filter(pl.col("shard_id") == shards[0])
    assert state.filter(pl.col("state") == VALID).height == state.height
    # the second attempt carried only the failed items
    intents = [a.request_ids for a in AttemptLog(Store(home), spec.name, shards[0]).all()]
    assert len(intents) == 2 and len(intents[1]) == failed_first
    assert len(sandbox.requests()) > sent_before
    assert Counter(ledger_ids(sandbox)).most_common(1)[0][1] == 1


def test_expired_batch_keeps_completed_items_and_retries_the_rest(sandbox, instance, resources, home, make_job):
    spec = make_job()
    shards = prepare(spec, instance, resources)
    sandbox.set_scenario("expire", complete_share=0.5)
    materialize_partition(spec, instance, resources, shards[0])
    store = Store(home)
    states = JobState.load(spec, store).states.filter(pl.col("shard_id") == shards[0])
    kept = states.filter(pl.col("state") == VALID).height
    assert 0 < kept < states.height
    assert states.filter(pl.col("state") != VALID)["failures"].max() == 0  # expiry spends no item's budget
    sandbox.set_scenario("normal")
    materialize_partition(spec, instance, resources, shards[0])
    states = JobState.load(spec, store).states.filter(pl.col("shard_id") == shards[0])
    assert states.filter(pl.col("state") == VALID).height == states.height
    billed = Counter(ledger_ids(sandbox))
    assert len(billed) == states.height and max(billed.values()) == 1


@pytest.mark.parametrize(("retries", "sends"), [({}, 1), ({"poison": 2}, 2)])
def test_poison_item_is_dead_lettered_after_its_budget(sandbox, instance, resources, home, make_job, retries, sends):
    """A poison item is not retried by default (retries.poison 1); its class's own budget says how often it goes."""
    rows = [{"ticket_id": f"T{i}", "subject": "s", "body": f"My invoice {i} was charged twice."} for i in range(12)]
    rows.append({"ticket_id": "TP", "subject": "s", "body": "this one is cursed [[sandbox:poison]]"})
    spec = make_job(rows=rows, retries={"per_item": 3, **retries}, canary={"max_failure_rate": 1.0})
    report = run_job(spec, instance, resources)
    assert report["complete"] and report["dead_lettered"] == 1 and report["succeeded"] == 12
    store = Store(home)
    dead = pl.read_parquet(store.read_bytes(JobPaths(spec.name).dead_letters))
    assert dead.height == 1 and dead["failures"][0] == sends and dead["last_error_code"][0] == "context_length_exceeded"
    states = JobState.load(spec, store)
    assert states.states.filter(pl.col("state") == DEAD).height == 1
    # how often the poison request went out: the attempts that carried it
    poison_id = dead["request_id"][0]
    carried = [
        a.number
        for shard in Manifest(spec.name, store).shard_ids()
        for a in AttemptLog(store, spec.name, shard).all()
        if poison_id in a.request_ids
    ]
    assert len(carried) == sends


def test_reconciliation_check_blocks_publishing_when_results_do_not_add_up(
    sandbox, instance, resources, home, make_job
):
    spec = make_job()
    run_job(spec, instance, resources)
    store = Store(home)
    # a result for an ID the manifest never had: the blocking check must fail the publish run
    from batch_pipeline.core.ledger.result_parts import read_results, write_results

    stray = read_results(store, spec.name).head(1).with_columns(pl.lit("f" * 64).alias("request_id"))
    write_results(store, spec.name, "s00001", 99, 1, stray.to_arrow())
    with pytest.raises(dg.Failure, match="reconciliation"):
        run_job(spec, instance, resources)


def test_publishing_before_any_manifest_fails_with_a_clear_message(sandbox, instance, resources, make_job):
    spec = make_job()
    defs = build_definitions([spec], resources)
    result = dg.materialize(
        [*defs.assets, *defs.asset_checks],
        selection=[asset_key(spec, "results")],
        instance=instance,
        resources=defs.resources,
        raise_on_error=False,
    )
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert "materialize t/manifest first" in failure.step_failure_data.error.message
