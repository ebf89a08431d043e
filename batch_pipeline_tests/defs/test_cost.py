"""Quotes you can hold us to, and a budget that is never crossed."""

import json
from collections import Counter
from datetime import UTC, datetime, timedelta

import dagster as dg
import polars as pl
import pytest

from batch_pipeline.core.control import JobControl
from batch_pipeline.core.cost import load_prices
from batch_pipeline.core.manifest import build_manifest
from batch_pipeline.core.publish import JobState
from batch_pipeline.core.quote import QuoteRefused, make_quote, verify_quote
from batch_pipeline.core.spec import load_spec
from batch_pipeline.core.store import Store
from batch_pipeline.defs.assets import asset_key
from batch_pipeline.defs.pipeline import run_job
from batch_pipeline.definitions import build_definitions

from .conftest import REPO, SMALL, ledger_ids

PRICES = load_prices(REPO / "data" / "prices.yaml")


def quote_for(spec, store) -> dict:
    state = JobState.load(spec, store)
    return make_quote(spec, store, PRICES, state.items, state.results, state.states)


def test_a_long_shared_system_prompt_is_counted_once_per_request(make_job, home):
    short = make_job(name="short")
    long_system = "You label support tickets. " * 200  # ~5,400 bytes, ~1,350 tokens
    longer = make_job(name="longer", prompt={"version": "v1", "system": long_system, "template": "{subject} {body}"})
    store = Store(home)
    build_manifest(short, store)
    build_manifest(longer, store)
    q_short, q_long = quote_for(short, store), quote_for(longer, store)
    n = q_long["pending_requests"]
    assert n == 40
    extra_per_request = (q_long["passes"]["first"]["input_tokens"] - q_short["passes"]["first"]["input_tokens"]) / n
    extra_system_tokens = (len(long_system.encode()) - len(short.prompt.system.encode())) / 4
    assert extra_per_request == pytest.approx(extra_system_tokens, rel=0.03)
    assert q_long["cache_hit_share"]["high"] > 0.8 > q_short["cache_hit_share"]["high"]


def test_calibrated_quote_matches_billed_tokens_within_5_percent(sandbox, make_job, instance, resources, home):
    spec = make_job()
    defs = build_definitions([spec], resources)
    assets = [*defs.assets, *defs.asset_checks]
    dg.materialize(assets, selection=[asset_key(spec, "manifest"), asset_key(spec, "quote")], instance=instance,
                   resources=defs.resources)
    # the first shard is the calibration sample
    dg.materialize(assets, selection=[asset_key(spec, "submissions"), asset_key(spec, "shard_results")],
                   partition_key="s00001", instance=instance, resources=defs.resources)
    store = Store(home)
    quote = quote_for(spec, store)
    assert quote["calibration"]["items_measured"] == 10 and quote["pending_requests"] == 30
    billed_before = {e["custom_id"] for e in sandbox.ledger()}
    run_job(spec, instance, resources)
    rest = [e for e in sandbox.ledger() if e["custom_id"] not in billed_before]
    billed_input = sum(e["input_tokens"] for e in rest)
    assert len(rest) == 30
    assert quote["passes"]["first"]["input_tokens"] == pytest.approx(billed_input, rel=0.05)
    billed_output = sum(e["output_tokens"] for e in rest)
    assert quote["passes"]["first"]["output_tokens_expected"] == pytest.approx(billed_output, rel=0.05)


def test_changed_input_or_prompt_or_time_makes_the_old_quote_unacceptable(make_job, home, tmp_path):
    spec = make_job()
    store = Store(home)
    build_manifest(spec, store)
    quote = quote_for(spec, store)
    assert verify_quote(spec, store, PRICES, quote) is quote
    with pytest.raises(QuoteRefused, match="expired"):
        verify_quote(spec, store, PRICES, quote, now=datetime.now(UTC) + timedelta(minutes=31))
    # a changed prompt
    changed = make_job(prompt={**spec.prompt.model_dump(), "version": "v2"})
    with pytest.raises(QuoteRefused, match="prompt version"):
        verify_quote(changed, store, PRICES, quote)
    # a grown input file
    with (tmp_path / "data" / "in" / "rows.jsonl").open("a") as f:
        f.write(json.dumps({"ticket_id": "NEW", "subject": "s", "body": "one more ticket"}) + "\n")
    with pytest.raises(QuoteRefused, match="input files"):
        verify_quote(spec, store, PRICES, quote)


def test_a_budget_below_the_quote_blocks_submission_before_any_request(sandbox, make_job, instance, resources):
    spec = make_job(budget_usd=0.00001)
    with pytest.raises(dg.Failure, match="quote_within_budget"):
        run_job(spec, instance, resources)
    assert [r for r in sandbox.requests() if r["path"].startswith("/v1/")] == []


def test_budget_crossed_mid_run_stops_at_the_cap_and_resumes_when_raised(sandbox, make_job, instance, resources,
                                                                         home):
    """Text the byte-based estimate undercounts 4x: the canary shard measures it, the re-quote refuses."""
    rows = [{"ticket_id": f"T{i}", "subject": "s", "body": "!?" * 150 + f" ticket {i}"} for i in range(40)]
    probe = make_job(rows=rows)
    store = Store(home)
    build_manifest(probe, store)
    quote = quote_for(probe, store)
    budget = quote["est_cost_usd"]["high"] * 1.01  # the uncalibrated quote fits; the real token count does not
    spec = make_job(rows=rows, budget_usd=budget)
    with pytest.raises(dg.Failure, match="budget"):
        run_job(spec, instance, resources)
    state = JobState.load(spec, store)
    spent = float(state.results["cost_usd"].sum())
    assert 0 < spent <= budget
    valid_before = set(state.states.filter(pl.col("state") == "valid")["request_id"])
    assert len(valid_before) == 10  # the canary shard only
    # raise the budget and resume: nothing valid is sent again
    raised = make_job(rows=rows, budget_usd=budget * 10)
    JobControl(store, raised.name).clear()
    report = run_job(raised, instance, resources)
    assert report["complete"] and report["succeeded"] == 40
    billed = Counter(ledger_ids(sandbox))
    assert len(billed) == 40 and set(billed.values()) == {1}


def test_budget_guard_refuses_the_submission_that_would_cross_and_stops_the_job(sandbox, make_job, instance,
                                                                             resources, home):
    from batch_pipeline.core.budget import BudgetGuard
    from batch_pipeline.core.errors import SystemicError
    from batch_pipeline.core.runner import ShardRunner
    from batch_pipeline.executors.registry import create_executor

    spec = make_job()
    store = Store(home)
    build_manifest(spec, store)
    price = PRICES.lookup(spec.backend.name, spec.model)
    runner = ShardRunner(spec, store, create_executor(spec.backend), price)
    pending = runner.pending_items("s00001")
    guard = BudgetGuard(spec, store, price)
    guard._calibrate()
    items = pl.from_arrow(runner.manifest.shard_items("s00001", ["est_input_tokens"]))
    one_shard = guard.request_cost_high(float(items["est_input_tokens"].sum()), items.height)
    tight = make_job(budget_usd=one_shard * 1.5)  # one shard fits, two do not
    runner = ShardRunner(tight, store, create_executor(tight.backend), price,
                         before_spend=BudgetGuard(tight, store, price).check)
    runner.submit("s00001")
    with pytest.raises(SystemicError, match="budget cap"):
        runner.submit("s00002")
    assert JobControl(store, tight.name).current()["code"] == "budget"
    creates = [r for r in sandbox.requests() if r["path"] == "/v1/batches" and r["method"] == "POST"]
    assert len(creates) == 1 and pending.num_rows == 10


def test_report_explains_quoted_vs_actual_by_pass_and_plots_spend(sandbox, make_job, instance, resources, home):
    rows = [json.loads(line) for line in SMALL.read_text().splitlines()]
    rows[0]["body"] += " [[sandbox:truncate]]"  # paid twice or more: a real retry cost
    spec = make_job(rows=rows, retries={"per_item": 3, "spend_cap_share": 1.0})
    report = run_job(spec, instance, resources)
    qa = report["quoted_vs_actual"]
    assert qa["actual_usd"] == pytest.approx(report["cost_usd"], abs=1e-6)
    assert qa["retries"]["actual"] > 0 and qa["first_pass"]["actual"] > 0
    assert qa["first_pass"]["actual"] <= qa["quoted_usd"]["high"]
    assert set(report["cost_by_attempt"]) >= {"1", "2"}
    assert sum(report["cost_by_attempt"].values()) == pytest.approx(report["cost_usd"], abs=1e-5)
    assert Store(home).read_bytes(f"jobs/{spec.name}/report.png")[:4] == b"\x89PNG"
