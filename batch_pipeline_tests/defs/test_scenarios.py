"""Every sandbox failure scenario, end to end through Dagster: the job ends reconciled (the blocking check
ran in the publish run) and every succeeded request was billed exactly once."""

from collections import Counter

import dagster as dg
import polars as pl
import pytest

from batch_pipeline.core.ledger.control import JobControl
from batch_pipeline.core.ledger.reconcile import DEAD, VALID
from batch_pipeline.core.publish.tables import JobState
from batch_pipeline.core.store import Store
from batch_pipeline.defs.pipeline import run_job

from .conftest import SMALL


def assert_settled(spec, home, sandbox, *, dead: int = 0) -> None:
    state = JobState.load(spec, Store(home))
    counts = state.check()  # the invariant, from independent sets
    assert counts.valid + counts.dead_lettered == counts.expected and counts.dead_lettered == dead
    billed = Counter(e["custom_id"] for e in sandbox.ledger())
    valid = set(state.states.filter(pl.col("state") == VALID)["request_id"])
    assert {rid: n for rid, n in billed.items() if rid in valid} == dict.fromkeys(valid, 1)
    for rid in state.states.filter(pl.col("state") == DEAD)["request_id"]:
        assert billed.get(rid, 0) <= spec.retries.per_item


@pytest.mark.parametrize(
    "name, params",
    [
        ("line_errors", {"rate": 0.3, "times": 1}),
        ("rate_limit", {"times": 3, "retry_after_ms": 50, "on": ["upload_file", "create_batch", "retrieve_batch"]}),
        (
            "server_error",
            {"times": 2, "on": ["upload_file", "create_batch", "retrieve_batch", "file_content"], "retry_after_ms": 50},
        ),
        ("slow", {"in_progress_s": 0.5}),
    ],
)
def test_transient_scenarios_complete_on_their_own(sandbox, make_job, instance, resources, home, name, params):
    spec = make_job(retries={"per_item": 3, "spend_cap_share": 0.5})
    sandbox.set_scenario(name, **params)
    report = run_job(spec, instance, resources)
    assert report["complete"] and report["succeeded"] == 40
    assert_settled(spec, home, sandbox)


def test_expiring_batches_keep_their_work_and_finish_once_the_provider_recovers(
    sandbox, make_job, instance, resources, home
):
    spec = make_job()
    sandbox.set_scenario("expire", complete_share=0.5)
    report = run_job(spec, instance, resources)
    assert 20 <= report["succeeded"] < 40 and report["dead_lettered"] == 0  # expiry spends no budget
    sandbox.set_scenario("normal")
    report = run_job(spec, instance, resources)
    assert report["complete"] and report["succeeded"] == 40
    assert_settled(spec, home, sandbox)


@pytest.mark.parametrize(
    "name, cause",
    [
        ("fail_validation", "line 1"),
        ("unknown_model", "model"),
        ("no_credit", "insufficient_quota"),
    ],
)
def test_systemic_scenarios_stop_once_then_resume(sandbox, make_job, instance, resources, home, name, cause):
    spec = make_job()
    sandbox.set_scenario(name)
    with pytest.raises(dg.Failure) as failure:
        run_job(spec, instance, resources)
    assert cause in failure.value.description
    store = Store(home)
    assert JobControl(store, spec.name).current() is not None
    assert JobState.load(spec, store).states.filter(pl.col("state") == DEAD).height == 0  # no budget burnt
    sandbox.set_scenario("normal")
    JobControl(store, spec.name).clear()
    report = run_job(spec, instance, resources)
    assert report["complete"] and report["succeeded"] == 40
    assert_settled(spec, home, sandbox)


def test_poison_truncated_and_refused_items_are_dead_lettered(sandbox, make_job, instance, resources, home):
    import json

    rows = [json.loads(line) for line in SMALL.read_text().splitlines()][:20]
    for row, marker in zip(rows[:3], ("[[sandbox:poison]]", "[[sandbox:truncate]]", "[[sandbox:refuse]]")):
        row["body"] += f" {marker}"
    # 2 of the canary's answers break the contract: let this canary pass, to follow the items to their dead letters
    spec = make_job(rows=rows, retries={"per_item": 2, "spend_cap_share": 1.0}, canary={"max_failure_rate": 0.5})
    report = run_job(spec, instance, resources)
    assert report["complete"] and report["succeeded"] == 17 and report["dead_lettered"] == 3
    assert_settled(spec, home, sandbox, dead=3)
    dead = JobState.load(spec, Store(home)).states.filter(pl.col("state") == DEAD)
    assert set(dead["last_error_code"]) == {"context_length_exceeded", "truncated", "contract_violation"}
