"""The fallback model: items the primary cannot answer go to it; a systemic error never does."""

import dagster as dg
import polars as pl
import pytest

from batch_pipeline.core.ledger.result_parts import read_results
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline.defs.pipeline import run_job

# per_item 2: a line_errors key that fails 3 times spends the primary's budget, then the fallback's first try
# (the sandbox counts sightings across batches), and the fallback's second try succeeds
RETRIES = {"per_item": 2, "spend_cap_share": 1.0}
FALLBACK = {"model": "gpt-4o"}


def test_items_that_exhaust_the_primary_are_answered_by_the_fallback(sandbox, make_job, instance, resources, home):
    spec = make_job(retries=RETRIES, fallback=FALLBACK, canary_first=False)
    sandbox.set_scenario("line_errors", rate=0.3, times=3)
    report = run_job(spec, instance, resources)
    assert report["complete"] and report["succeeded"] == 40 and report["dead_lettered"] == 0
    store = Store(home)
    validated = pl.read_parquet(store.read_bytes(JobPaths(spec.name).validated))
    by_model = dict(validated.filter(~pl.col("is_duplicate")).group_by("model").len().iter_rows())
    assert set(by_model) == {"gpt-4o-mini", "gpt-4o"} and sum(by_model.values()) == 40
    ledger = sandbox.ledger()
    fallback_billed = sorted(e["custom_id"] for e in ledger if e["model"] == "gpt-4o")
    answered = validated.filter(pl.col("model") == "gpt-4o")
    # the fallback was billed for exactly the items it answered, once each; the primary never answered them
    assert fallback_billed == sorted(answered.filter(~pl.col("is_duplicate"))["request_id"].to_list())
    primary_ok = {e["custom_id"] for e in ledger if e["model"] == "gpt-4o-mini"}
    assert primary_ok.isdisjoint(fallback_billed)
    results = read_results(store, spec.name)
    primary_failed = results.filter((pl.col("model") == "gpt-4o-mini") & (pl.col("status") != "succeeded"))
    assert set(primary_failed["request_id"]) == set(fallback_billed)
    assert primary_failed.group_by("request_id").len()["len"].to_list() == [2] * len(fallback_billed)
    # its cost apart in the report
    fb_cost = float(results.filter(pl.col("model") == "gpt-4o")["cost_usd"].sum())
    assert report["fallback"]["model"] == "gpt-4o" and report["fallback"]["answered"] == by_model["gpt-4o"]
    assert report["fallback"]["cost_usd"] == pytest.approx(fb_cost, abs=1e-6) and fb_cost > 0
    assert report["cost_by_model"]["gpt-4o"] == pytest.approx(fb_cost, abs=1e-6)
    assert report["cost_usd"] == pytest.approx(fb_cost + report["cost_by_model"]["gpt-4o-mini"], abs=1e-5)
    # the quote's fallback allowance: a default share before anything was tried, the measured one after
    quotes = sorted(store.list_files(f"{JobPaths(spec.name).root}/quotes", suffix=".json"))
    first, later = store.read_json(quotes[0]), store.read_json(quotes[-1])
    assert first["passes"]["fallback"]["share"] == 0.02 and first["passes"]["fallback"]["cost_expected"] > 0
    assert later["passes"]["fallback"]["measured_on"] > 0 and later["passes"]["fallback"]["model"] == "gpt-4o"


def test_a_systemic_error_never_falls_back(sandbox, make_job, instance, resources, home):
    spec = make_job(retries=RETRIES, fallback=FALLBACK, canary_first=False)
    sandbox.set_scenario("line_errors", rate=0.3, times=5, code="invalid_api_key")
    with pytest.raises(dg.Failure, match="invalid_api_key"):
        run_job(spec, instance, resources)
    assert [e for e in sandbox.ledger() if e["model"] == "gpt-4o"] == []
    results = read_results(Store(home), spec.name)
    assert "gpt-4o" not in set(results["model"])
    creates = [r for r in sandbox.requests() if r["method"] == "POST" and r["path"] == "/v1/batches"]
    assert creates and all('gpt-4o"' not in str(r.get("body", "")) for r in creates)
