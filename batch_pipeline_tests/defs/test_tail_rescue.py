"""Tail rescue: after an expiry or near the deadline, unfinished items finish online at the interactive price."""

from datetime import UTC, datetime, timedelta

import polars as pl

from batch_pipeline.core.ledger.result_parts import read_results
from batch_pipeline.core.store import Store
from batch_pipeline.defs.pipeline import run_job

TAIL = {"backend": {"name": "online", "settings": {"sandbox": True, "concurrency": 4}}, "before_deadline_minutes": 60}


def test_expired_batch_tail_completes_online_and_its_cost_is_reported_apart(
    sandbox, make_job, instance, resources, home
):
    deadline = (datetime.now(UTC) + timedelta(hours=6)).isoformat()
    spec = make_job(deadline=deadline, tail=TAIL)
    sandbox.set_scenario("expire", complete_share=0.5)
    report = run_job(spec, instance, resources)
    assert report["complete"] and report["succeeded"] == 40 and report["passes"] == 1
    results = read_results(Store(home), spec.name).filter(pl.col("status") == "succeeded")
    by_pricing = dict(results.group_by("pricing").len().iter_rows())
    assert by_pricing["batch"] >= 20 - 4 and by_pricing["online"] == 40 - by_pricing["batch"]
    assert set(results.filter(pl.col("pricing") == "online")["backend"]) == {"online"}
    assert report["cost_by_pricing"]["online"] > 0 and report["cost_by_pricing"]["batch"] > 0
    # online rows are priced at the interactive rate: twice the batch price per token here
    per_token = results.group_by("pricing").agg(
        (pl.col("cost_usd").sum() / (pl.col("input_tokens") + pl.col("output_tokens")).sum()).alias("r")
    )
    rates = dict(per_token.iter_rows())
    assert 1.5 < rates["online"] / rates["batch"] < 2.5
    # billed once: every batch success once, and one online call per rescued item
    ledger = sandbox.ledger()
    batch_billed = [e["custom_id"] for e in ledger if e.get("mode") != "online"]
    online_billed = [e for e in ledger if e.get("mode") == "online"]
    assert len(batch_billed) == len(set(batch_billed)) == by_pricing["batch"]
    assert len(online_billed) == by_pricing["online"]


def test_deadline_near_sends_the_shards_online_instead_of_to_a_batch(sandbox, make_job, instance, resources, home):
    deadline = (datetime.now(UTC) + timedelta(minutes=20)).isoformat()
    spec = make_job(deadline=deadline, tail=TAIL)
    report = run_job(spec, instance, resources)
    assert report["complete"] and report["succeeded"] == 40
    assert set(report["cost_by_pricing"]) == {"online"}
    creates = [r for r in sandbox.requests() if r["path"] == "/v1/batches" and r["method"] == "POST"]
    assert creates == []
