"""backend: auto end to end: each shard is routed before submission and lands on the backend the table says."""

import json
import re

import dagster as dg
import polars as pl

from batch_pipeline.core.ledger.result_parts import read_results
from batch_pipeline.core.route.plan import RouteBook
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline.defs.pipeline import run_job

SANDBOX = {"sandbox": True}
ROUTE = {
    "candidates": [
        {"backend": {"name": "bedrock_batch", "settings": SANDBOX}, "model": "meta.llama3-1-8b-instruct-v1:0"},
        {"backend": {"name": "openai_batch", "settings": SANDBOX}},
        {"backend": {"name": "anthropic_batch", "settings": SANDBOX}, "model": "claude-haiku-4-5"},
    ],
    "min_batch_items": 9,  # the 35 rows are dealt 9, 9, 9, 8: the last shard is tiny
    "online": {"backend": {"name": "online", "settings": SANDBOX}},
}


def rows(n: int) -> list[dict]:
    return [
        {"ticket_id": f"t{i}", "subject": f"Subject {i}", "body": f"My invoice number {i} was charged twice."}
        for i in range(n)
    ]


def test_a_routed_jobs_shards_land_where_the_table_says(sandbox, make_job, instance, resources, home):
    spec = make_job(rows=rows(35), backend={"name": "auto"}, route=ROUTE, canary_first=False)
    report = run_job(spec, instance, resources)
    assert report["complete"] and report["succeeded"] == 35
    store = Store(home)
    book = RouteBook(store, spec.name)
    results = read_results(store, spec.name)
    sizes = dict(results.group_by("shard_id").agg(pl.col("request_id").n_unique()).iter_rows())
    seen = dict(results.group_by("shard_id").agg(pl.col("backend").unique()).iter_rows())
    for shard_id, n in sizes.items():
        choice = book.get(shard_id)
        assert choice is not None
        # OpenAI's batch is the cheapest here; Bedrock is out (100 records a job at least); below 9 items: online
        want = ("online", "tiny_shard") if n < 9 else ("openai_batch", "cheapest")
        assert (choice.backend, choice.rule) == want, (shard_id, n, choice)
        assert choice.excluded["bedrock_batch/meta.llama3-1-8b-instruct-v1:0"].startswith(
            "tiny_shard" if n < 9 else "provider_minimum"
        )
        assert list(seen[shard_id]) == [choice.backend]
    assert any(n < 9 for n in sizes.values()) and any(n >= 9 for n in sizes.values())
    # the sandbox saw the batches on OpenAI only and the tiny shard's calls online; nothing on Bedrock
    creates = [r for r in sandbox.requests() if r["method"] == "POST" and r["path"] == "/v1/batches"]
    assert len(creates) == sum(1 for n in sizes.values() if n >= 9)
    online = [e for e in sandbox.ledger() if e.get("mode") == "online"]
    assert len(online) == sum(n for n in sizes.values() if n < 9)
    assert not [r for r in sandbox.requests() if "model-invocation-job" in r["path"]]
    # the choice and its reason: in the quote, the shard's route file and the report
    first = sorted(store.list_files(f"{JobPaths(spec.name).root}/quotes", suffix=".json"))[0]
    quote = store.read_json(first)
    assert {r["shard_id"]: r["backend"] for r in quote["route"]} == {s: book.get(s).backend for s in sizes}
    assert report["route"] and all(r["reason"] for r in report["route"])
    assert set(report["cost_by_backend"]) == {"openai_batch", "online"}
    assert json.loads(json.dumps(report["route"]))[0]["costs"]


def test_quote_compare_shows_the_route_with_the_cost_of_each_choice(make_job, home, capsys, monkeypatch):
    from batch_pipeline.cli import main

    monkeypatch.setenv("COLUMNS", "400")  # the table's columns whole
    spec = make_job(rows=rows(35), backend={"name": "auto"}, route=ROUTE, canary_first=False)
    assert main(["quote", spec.source_path, "--home", str(home), "--compare"]) == 0
    out = capsys.readouterr().out
    assert "the route (backend: auto)" in out and "tiny_shard" in out and "cheapest" in out
    route = out[out.index("the route (backend: auto)") :]
    for shard in ("s00001", "s00002", "s00003", "s00004"):
        row = next((ln for ln in route.splitlines() if shard in ln), None)
        assert row is not None, route
        assert len([c for c in row.split("│") if re.fullmatch(r"\$\d[\d.,]*", c.strip())]) == 4, (
            row
        )  # each candidate's cost
    assert "bedrock_batch" in route and "online" in route
    # the comparison itself: the routed total (auto) first, each candidate after it
    rows_ = [ln.split("│")[1].strip() for ln in out[: out.index("the route")].splitlines() if ln.startswith("│")]
    assert rows_[:4] == ["auto", "bedrock_batch", "openai_batch", "anthropic_batch"], rows_


def test_the_sensors_drive_a_routed_job_polling_each_batch_at_its_own_backend(
    sandbox, make_job, instance, resources, home
):
    """``backend: auto`` under the daemon: the shard sensor asks each open batch at the backend its handle names
    (the job's own backend is no executor), and the job publishes with every request paid once."""
    import time

    from batch_pipeline.defs.jobs import build_jobs
    from batch_pipeline.defs.sensors import build_new_data_sensor, build_shard_sensor

    from .conftest import ledger_ids
    from .test_sensors import _execute, _requests

    spec = make_job(rows=rows(35), backend={"name": "auto"}, route=ROUTE, canary_first=False)
    jobs = build_jobs(spec)
    new_data, driver = build_new_data_sensor(spec, jobs), build_shard_sensor(spec, jobs)
    [prepare] = _requests(new_data(dg.build_sensor_context(instance=instance)))
    _execute(spec, instance, resources, prepare, "prepare")
    published = False
    for _ in range(300):
        requests = _requests(driver(dg.build_sensor_context(instance=instance, resources=resources)))
        for request in requests:
            _execute(spec, instance, resources, request, "submit")
            published |= request.job_name == f"{spec.name}_publish"
        if published:
            break
        if not requests:
            time.sleep(0.1)
    assert published, "the routed job never reached publish under the sensors"
    report = Store(home).read_json(f"jobs/{spec.name}/report.json")
    assert report["complete"] and report["succeeded"] == 35
    batch_ids = [i for i in ledger_ids(sandbox) if i is not None]  # online entries carry no custom_id
    online = [e for e in sandbox.ledger() if e.get("mode") == "online"]
    assert len(set(batch_ids)) == len(batch_ids) and len(batch_ids) + len(online) == 35  # each paid once
    assert set(report["cost_by_backend"]) == {"openai_batch", "online"}


def test_a_full_queue_loses_its_shards_to_the_next_cheapest_only_when_waiting_would_miss_the_deadline(
    make_job, home, capsys
):
    """OpenAI's batch is the cheapest, but another job holds all of the account's queue (its quota configured): with
    no deadline the shards wait for it; with a deadline 30 h away (room within 24 h, then a 24 h window) they go to
    the next cheapest, and the route says why. Quoted only: nothing is sent."""
    from datetime import UTC, datetime, timedelta

    from batch_pipeline.cli import main
    from batch_pipeline.core.ledger.capacity import Need
    from batch_pipeline.core.spec.job import BackendSpec
    from batch_pipeline.executors.registry import capacity_ledgers

    openai = {"name": "openai_batch", "settings": {**SANDBOX, "quota": {"enqueued_tokens": 5_000}}}
    route = {**ROUTE, "candidates": [{"backend": openai}, ROUTE["candidates"][2]]}
    store = Store(home)
    for deadline in (None, datetime.now(UTC) + timedelta(hours=30)):
        spec = make_job(rows=rows(35), backend={"name": "auto"}, route=route, canary_first=False, deadline=deadline)
        [ledger] = capacity_ledgers(store, BackendSpec.model_validate(openai), spec.model)
        if not ledger.snapshot().holdings:
            assert ledger.reserve("another_team", "s00001", 1, Need(5_000, 500, 1)) is not None
        assert main(["quote", spec.source_path, "--home", str(home)]) == 0
        capsys.readouterr()
        book = RouteBook(store, spec.name)
        for shard in ("s00001", "s00002", "s00003"):  # the 4th is tiny: online either way
            choice = book.get(shard)
            assert choice is not None
            if deadline is None:
                assert (choice.backend, choice.rule) == ("openai_batch", "cheapest"), choice
                continue
            rest = {k: v for k, v in choice.costs.items() if not k.startswith("openai_batch")}
            assert f"{choice.backend}/{choice.model}" == min(rest, key=rest.__getitem__), choice
            assert choice.rule == "queue_full" and "its queue is full (room within 24.0 h)" in choice.reason, choice
