"""Quotes you can hold us to, and a budget that is never crossed."""

import json
from collections import Counter
from datetime import UTC, datetime, timedelta

import dagster as dg
import polars as pl
import pytest

from batch_pipeline.core.ledger.control import JobControl
from batch_pipeline.core.manifest.shards import Manifest, build_manifest
from batch_pipeline.core.money.job_quote import make_quote
from batch_pipeline.core.money.quote import QuoteRefused, quote_current, verify_quote
from batch_pipeline.core.money.quote_record import Quote
from batch_pipeline.core.pricing.cost import load_prices
from batch_pipeline.core.pricing.tokenizers import counter_for
from batch_pipeline.core.publish.tables import JobState
from batch_pipeline.core.store import Store
from batch_pipeline.defs.assets import asset_key
from batch_pipeline.defs.build import build_definitions
from batch_pipeline.defs.pipeline import run_job

from .conftest import REPO, SMALL, ledger_ids

PRICES = load_prices(REPO / "data" / "prices.yaml")


def quote_for(spec, store) -> Quote:
    state = JobState.load(spec, store)
    return make_quote(spec, store, PRICES, state.quote_basis())


def test_a_long_shared_system_prompt_is_counted_once_per_request(make_job, home):
    short = make_job(name="short")
    long_system = "You label support tickets. " * 200  # ~5,400 bytes, ~1,350 tokens
    longer = make_job(name="longer", prompt={"version": "v1", "system": long_system, "template": "{subject} {body}"})
    store = Store(home)
    build_manifest(short, store)
    build_manifest(longer, store)
    q_short, q_long = quote_for(short, store), quote_for(longer, store)
    n = q_long.pending_requests
    assert n == 40
    extra_per_request = (q_long.passes.first.input_tokens - q_short.passes.first.input_tokens) / n
    o200k = counter_for(longer.model)  # the model's own tokenizer counts the system prompt
    extra_system_tokens = o200k.count([long_system])[0] - o200k.count([short.prompt.system])[0]
    assert extra_per_request == pytest.approx(extra_system_tokens, rel=0.03)
    assert q_long.cache_hit_share.high > 0.8 > q_short.cache_hit_share.high


def test_calibrated_quote_matches_billed_tokens_within_5_percent(sandbox, make_job, instance, resources, home):
    spec = make_job()
    defs = build_definitions([spec], resources)
    assets = [*defs.assets, *defs.asset_checks]
    dg.materialize(
        assets,
        selection=[asset_key(spec, "manifest"), asset_key(spec, "quote")],
        instance=instance,
        resources=defs.resources,
    )
    # the first shard is the calibration sample
    dg.materialize(
        assets,
        selection=[asset_key(spec, "submissions"), asset_key(spec, "shard_results")],
        partition_key="s00001",
        instance=instance,
        resources=defs.resources,
    )
    store = Store(home)
    quote = quote_for(spec, store)
    assert quote.calibration.items_measured == 10 and quote.pending_requests == 30
    billed_before = {e["custom_id"] for e in sandbox.ledger()}
    run_job(spec, instance, resources)
    rest = [e for e in sandbox.ledger() if e["custom_id"] not in billed_before]
    billed_input = sum(e["input_tokens"] for e in rest)
    assert len(rest) == 30
    assert quote.passes.first.input_tokens == pytest.approx(billed_input, rel=0.05)
    billed_output = sum(e["output_tokens"] for e in rest)
    assert quote.passes.first.output_tokens_expected == pytest.approx(billed_output, rel=0.05)


def test_the_driver_and_a_submission_judge_a_quote_by_one_freshness_rule(make_job, home):
    """Before, the driver re-quoted 2 min before expiry while a submission still spent on the quote until it expired:
    two cut-offs for one quote. Now a quote in its last 2 min is stale to both."""
    from batch_pipeline.core.spec.paths import JobPaths
    from batch_pipeline.core.state.view import quote_fresh

    spec = make_job()
    store = Store(home)
    build_manifest(spec, store)
    quote = quote_for(spec, store)
    store.write_json(JobPaths(spec.name).quote, quote.as_json())
    expires = datetime.fromisoformat(quote.expires_at)
    for before, current in (
        (timedelta(minutes=3), True),
        (timedelta(minutes=1), False),
        (-timedelta(minutes=1), False),
    ):
        now = expires - before
        assert quote_current(quote, now) is current and quote_fresh(store, spec.name, now) is current, before
        if current:
            assert verify_quote(spec, store, PRICES, quote, now=now) is quote
        else:
            with pytest.raises(QuoteRefused, match="quote again"):
                verify_quote(spec, store, PRICES, quote, now=now)


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


def test_budget_crossed_mid_run_stops_at_the_cap_and_resumes_when_raised(sandbox, make_job, instance, resources, home):
    """Text the documented density undercounts (Claude's ~3.5 characters per token is for English; Japanese has
    far more tokens per character): the canary shard measures it, the re-quote refuses."""
    rows = [
        {"ticket_id": f"T{i}", "subject": "s", "body": "請求書の金額が二重に引き落とされました。" * 8 + f" ticket {i}"}
        for i in range(40)
    ]
    claude = {"backend": {"name": "anthropic_batch", "settings": {"sandbox": True}}, "model": "claude-haiku-4-5"}
    probe = make_job(rows=rows, **claude)
    store = Store(home)
    build_manifest(probe, store)
    quote = quote_for(probe, store)
    budget = quote.est_cost_usd.high * 1.01  # the uncalibrated quote fits; the real token count does not
    spec = make_job(rows=rows, budget_usd=budget, **claude)
    with pytest.raises(dg.Failure, match="budget"):
        run_job(spec, instance, resources)
    state = JobState.load(spec, store)
    spent = float(state.results["cost_usd"].sum())
    assert 0 < spent <= budget
    valid_before = set(state.states.filter(pl.col("state") == "valid")["request_id"])
    assert len(valid_before) == 10  # the canary shard only
    # raise the budget and resume: nothing valid is sent again
    raised = make_job(rows=rows, budget_usd=budget * 10, **claude)
    JobControl(store, raised.name).clear()
    report = run_job(raised, instance, resources)
    assert report["complete"] and report["succeeded"] == 40
    billed = Counter(ledger_ids(sandbox))
    assert len(billed) == 40 and set(billed.values()) == {1}


def test_budget_guard_refuses_the_submission_that_would_cross_and_stops_the_job(
    sandbox, make_job, instance, resources, home
):
    from batch_pipeline.core.errors import SystemicError
    from batch_pipeline.core.money.budget import BudgetGuard
    from batch_pipeline.core.run.runner import ShardRunner
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
    runner = ShardRunner(
        tight, store, create_executor(tight.backend), price, before_spend=BudgetGuard(tight, store, price).check
    )
    runner.submit("s00001")
    with pytest.raises(SystemicError, match="budget cap"):
        runner.submit("s00002")
    assert JobControl(store, tight.name).current().code == "budget"
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


# -- golden probes: paid requests that are not items -------------------------------------------------------------

QUALITY = {
    "golden": str(REPO / "data" / "golden" / "demo.jsonl"),
    "canary_min_accuracy": 0.85,
    "golden_share": 0.1,
    "eval_backend": {"name": "online", "settings": {"sandbox": True}},
}


def probes_by_hand(spec, shards: list[str]) -> list[str]:
    """The rendered prompts of the probes that ride along: every golden record with the canary shard (the
    first), then ceil(golden_share x 10 items) = 1 per other shard, the golden record whose salted ID sorts first."""
    from batch_pipeline.core.quality.evals import load_golden
    from batch_pipeline.core.quality.golden import probe_id

    golden = load_golden(spec).to_dicts()
    prompts = [g["user_prompt"] for g in golden]
    for shard in shards[1:]:
        prompts.append(min(golden, key=lambda g: probe_id(shard, g["golden_id"]))["user_prompt"])
    return prompts


def test_the_quote_of_a_job_with_a_golden_set_is_higher_by_exactly_its_probes(make_job, home):
    from batch_pipeline.core.money.estimate import schema_text

    plain, gold = make_job(name="plain"), make_job(name="gold", quality=QUALITY)
    store = Store(home)
    build_manifest(plain, store)
    build_manifest(gold, store)
    q_plain, q_gold = quote_for(plain, store), quote_for(gold, store)
    assert q_plain.pending_requests == q_gold.pending_requests == 40
    assert q_plain.probe_requests == 0 and q_gold.probe_requests == 60 + 3 == q_gold.passes.probes.requests
    # the items' passes are the same; the probes are a pass of their own
    assert q_gold.passes.first == q_plain.passes.first
    assert q_gold.passes.retries == q_plain.passes.retries
    # the probes' estimate by hand, from the golden set's rendered prompts, priced at the high end: o200k tokens per
    # prompt + the system prompt + 4 per message x 2 + 3 priming + the output schema, x 1.25 before anything is
    # measured; 16 output tokens each (max_tokens); no cache read; gpt-4o-mini on the batch API
    prompts = probes_by_hand(gold, ["s00001", "s00002", "s00003", "s00004"])
    o200k = counter_for(gold.model)
    per_request = o200k.count([gold.prompt.system])[0] + 4 + 4 + 3 + o200k.count([schema_text(gold)])[0]
    tokens = sum(o200k.count(prompts)) + len(prompts) * per_request
    assert q_gold.passes.probes.input_tokens == tokens
    high_by_hand = (tokens * 1.25 * 0.15 + 63 * 16 * 0.60) / 1e6 * 0.5
    assert q_gold.passes.probes.cost_high == pytest.approx(high_by_hand, rel=1e-9)
    for level in ("low", "expected", "high"):
        extra = getattr(q_gold.est_cost_usd, level) - getattr(q_plain.est_cost_usd, level)
        assert extra == pytest.approx(
            getattr(q_gold.passes.probes, f"cost_{level}"), abs=2e-6
        )  # est is rounded to 1e-6
    assert q_gold.est_cost_usd.high - q_plain.est_cost_usd.high == pytest.approx(high_by_hand, abs=2e-6)


def test_the_budget_guard_refuses_a_submission_its_probes_push_over_the_budget(
    sandbox, make_job, instance, resources, home
):
    from batch_pipeline.core.errors import SystemicError
    from batch_pipeline.core.money.budget import BudgetGuard
    from batch_pipeline.core.quality.golden import canary_sample
    from batch_pipeline.defs.resources import PricesResource, StoreResource
    from batch_pipeline.defs.runners import shard_runner

    store = Store(home)
    plain, gold = make_job(name="plain"), make_job(name="gold", quality=QUALITY)
    build_manifest(plain, store)
    build_manifest(gold, store)
    # a real run: a budget between the items' quote and the items' + probes' quote
    items_high, all_high = (
        quote_for(plain, store).est_cost_usd.high,
        quote_for(gold, store).est_cost_usd.high,
    )
    assert all_high > items_high
    budget = (items_high + all_high) / 2
    with pytest.raises(dg.Failure, match="budget"):
        run_job(make_job(name="gold", quality=QUALITY, budget_usd=budget), instance, resources)
    assert [r for r in sandbox.requests() if r["path"].startswith("/v1/")] == []  # nothing was sent
    report = run_job(make_job(name="plain", budget_usd=budget), instance, resources)  # the items alone fit
    assert report["complete"] and 0 < report["cost_usd"] <= budget
    sandbox.reset()

    # the guard before the paid call (the runner run_job uses: the guard and the probe hook): the canary shard's
    # 10 items fit the budget, its 60 probes on top do not
    price = PRICES.lookup(gold.backend.name, gold.model)
    guard = BudgetGuard(gold, store, price)
    guard._calibrate()
    items = pl.from_arrow(Manifest(gold.name, store).shard_items("s00001", ["request_id", "est_input_tokens"]))
    items_cost = guard.request_cost_high(float(items["est_input_tokens"].sum()), items.height)
    probes = guard.riding_probes("s00001")
    assert probes.height == 60
    probes_cost = guard.request_cost_high(float(probes["est_input_tokens"].sum()), probes.height)
    tight = make_job(name="gold", quality=QUALITY, budget_usd=items_cost + probes_cost / 2)
    runner = shard_runner(tight, StoreResource(root=str(home)), PricesResource(path=str(REPO / "data" / "prices.yaml")))
    canary = canary_sample(items, tight.canary.size)
    with pytest.raises(SystemicError, match=r"budget cap: .*\(10 items \$.* \+ 60 golden probes \$"):
        runner.submit("s00001", only=canary, canary=True)
    assert JobControl(store, tight.name).current().code == "budget"
    assert [r for r in sandbox.requests() if r["path"].startswith("/v1/")] == []
    # the same budget without a golden set: the same 10 items go out
    fits = make_job(name="plain2", budget_usd=tight.budget_usd)
    build_manifest(fits, store)
    sub = shard_runner(
        fits, StoreResource(root=str(home)), PricesResource(path=str(REPO / "data" / "prices.yaml"))
    ).submit("s00001", only=canary, canary=True)
    assert sub.requests == 10 and sub.handle is not None


# -- Anthropic: cache writes at their real rate -------------------------------------------------------------------


def test_an_anthropic_job_costs_what_its_ledger_tokens_cost_by_hand(sandbox, make_job, instance, resources, home):
    """A system prompt long enough to cache: the first request with it writes the cache (1.25x input), every
    later one reads it (0.1x). The job's reported cost is the sandbox ledger's tokens priced by hand."""
    system = "You label customer support tickets with one label: billing, bug, feature_request, account or other. " * 70
    spec = make_job(
        name="anth",
        model="claude-haiku-4-5",
        backend={"name": "anthropic_batch", "settings": {"sandbox": True}},
        prompt={"version": "v1", "system": system, "template": "Subject: {subject}\nTicket:\n{body}"},
    )
    store = Store(home)
    build_manifest(spec, store)
    quote = quote_for(spec, store)
    assert quote.cache.writes_billed and quote.cache.first_write_batches == 4  # 4 shards of 10
    report = run_job(spec, instance, resources)
    assert report["complete"] and report["succeeded"] == 40
    ledger = sandbox.ledger()
    assert len(ledger) == 40
    writes = sum(e["cache_creation_input_tokens"] for e in ledger)
    reads = sum(e["cached_tokens"] for e in ledger)
    total_in = sum(e["input_tokens"] for e in ledger)  # uncached + writes + reads
    out = sum(e["output_tokens"] for e in ledger)
    assert writes > 1024 and reads > 30 * 1024  # the prefix written once, read by the other 39 requests
    assert sum(1 for e in ledger if e["cache_creation_input_tokens"]) == 1
    # claude-haiku-4-5 on the batch API: $1.00 in, x1.25 a 5-minute cache write, $0.10 a cache read, $5.00 out, half off
    by_hand = ((total_in - writes - reads) * 1.00 + writes * 1.00 * 1.25 + reads * 0.10 + out * 5.00) / 1e6 * 0.5
    assert report["cost_usd"] == pytest.approx(by_hand, abs=1e-6)  # the report rounds to 1e-6
    state = JobState.load(spec, store)
    assert int(state.results["cache_write_tokens"].sum()) == writes
    assert float(state.results["cost_usd"].sum()) == pytest.approx(by_hand, rel=1e-9)
    writes_at_input_rate = ((total_in - reads) * 1.00 + reads * 0.10 + out * 5.00) / 1e6 * 0.5
    assert by_hand - writes_at_input_rate == pytest.approx(writes * 0.25 / 1e6 * 0.5, rel=1e-9)
    assert float(state.results["cost_usd"].sum()) <= quote.est_cost_usd.high


def test_the_budget_guard_counts_what_a_kill_may_have_billed(sandbox, make_job, instance, resources, home):
    """An online attempt a SIGKILL left with requests in flight (sent, no answer stored) counts at its upper bound:
    a submission that fits the budget only without that bound is refused."""
    from batch_pipeline.core.errors import SystemicError
    from batch_pipeline.core.ledger.attempts import AttemptLog
    from batch_pipeline.core.money.budget import BudgetGuard
    from batch_pipeline.core.run.runner import ShardRunner
    from batch_pipeline.executors.registry import create_executor

    spec = make_job()
    store = Store(home)
    build_manifest(spec, store)
    price = PRICES.lookup(spec.backend.name, spec.model)
    guard = BudgetGuard(spec, store, price)
    guard._calibrate()
    items = pl.from_arrow(Manifest(spec.name, store).shard_items("s00001", ["est_input_tokens"]))
    one_shard = guard.request_cost_high(float(items["est_input_tokens"].sum()), items.height)
    tight = make_job(budget_usd=one_shard * 1.2)  # the shard fits ...
    runner = ShardRunner(
        tight, store, create_executor(tight.backend), price, before_spend=BudgetGuard(tight, store, price).check
    )
    log = AttemptLog(store, tight.name, "s00002")  # ... but a kill left an online attempt with 8 requests in flight
    log.create_intent(1, {"key": f"{tight.name}:s00002:1", "backend": "online", "request_ids": [], "requests": 8})
    log.record(1, "abandoned", {"reason": "interrupted", "possibly_billed": 8, "possibly_billed_usd": one_shard * 0.5})
    with pytest.raises(SystemicError, match="budget cap"):
        runner.submit("s00001")
    assert not [r for r in sandbox.requests() if r["path"] == "/v1/batches" and r["method"] == "POST"]
    JobControl(store, tight.name).clear()
    roomy = make_job(budget_usd=one_shard * 1.6)  # room for both: sent
    ShardRunner(
        roomy, store, create_executor(roomy.backend), price, before_spend=BudgetGuard(roomy, store, price).check
    ).submit("s00001")
