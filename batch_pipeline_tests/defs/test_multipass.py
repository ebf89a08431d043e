"""Multi-pass jobs on the sandbox: a label pass, then a JSON extraction over one label (``input.from_job``).

End to end through materialize() and through the sensors; a changed upstream answer re-runs one downstream
request (ledger); the quote's second-pass share moves from assumed to measured; the cascade view's rows.
"""

import json
import time

import dagster as dg
import duckdb
import polars as pl
import pytest

from batch_pipeline.core.errors import ConfigError
from batch_pipeline.core.manifest.shards import Manifest
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline.defs.build import build_definitions
from batch_pipeline.defs.jobs import build_jobs
from batch_pipeline.defs.pipeline import run_job
from batch_pipeline.defs.sensors import build_new_data_sensor, build_shard_sensor, build_upstream_sensor

from .conftest import ledger_ids
from .test_sensors import _execute, _requests

EXTRACT_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["topic", "urgent"],
    "properties": {"topic": {"type": "string"}, "urgent": {"type": "boolean"}},
}


def two_pass(make_job, where: str = "output = 'other'", template: str = "A ticket labelled {output}:\n{body}"):
    triage = make_job(name="triage")
    extract = make_job(
        name="extract",
        input={"from_job": "triage", "where": where, "text_field": "body"},
        prompt={"version": "x1", "system": "Extract the ticket's topic and urgency as JSON.", "template": template},
        sampling={"temperature": 0, "max_tokens": 200},
        output={"json_schema": EXTRACT_SCHEMA},
    )
    return triage, extract


def validated(store: Store, job: str) -> pl.DataFrame:
    return pl.read_parquet(store.read_bytes(JobPaths(job).validated))


def items(store: Store, job: str) -> set[str]:
    return set(pl.from_arrow(Manifest(job, store).item_index(["request_id"]))["request_id"])


def test_two_pass_job_end_to_end_through_materialize(sandbox, make_job, instance, resources, home):
    triage, extract = two_pass(make_job)
    store = Store(home)
    run_job(triage, instance, resources)
    first = validated(store, "triage")
    wanted = first.filter(pl.col("output") == "other")
    assert 0 < wanted.height < first.height
    report = run_job(extract, instance, resources)
    second = validated(store, "extract")
    # the upstream's row identity is kept: the same source rows, lines and keys as the label pass's 'other' rows
    key = ["source", "line", "source_key"]
    assert second.select(key).sort(key).equals(wanted.select(key).sort(key))
    assert all(set(json.loads(o)) == {"topic", "urgent"} for o in second["output"])
    # the upstream answer is in the prompt the second pass sent
    prompts = pl.from_arrow(Manifest("extract", store).item_index(["request_id", "user_prompt"]))
    assert all(p.startswith("A ticket labelled other:\n") for p in prompts["user_prompt"])
    billed = ledger_ids(sandbox)
    assert len(billed) == len(set(billed)) and items(store, "extract") <= set(billed)
    # the report: cost per accepted item per pass and in total
    passes = report["cascade"]["passes"]
    assert [p["job"] for p in passes] == ["triage", "extract"]
    assert passes[1]["accepted"] == report["succeeded"] and passes[1]["cost_per_accepted_item_usd"] > 0
    total = report["cascade"]["total"]
    assert total["final_answers"] == first.height
    assert total["cost_usd"] == pytest.approx(passes[0]["cost_usd"] + passes[1]["cost_usd"], abs=1e-6)
    assert total["cost_per_accepted_item_usd"] == pytest.approx(total["cost_usd"] / first.height, rel=1e-4)
    # the cascade view: one final answer per source row, with the pass that produced it
    con = duckdb.connect(str(store.local_path(JobPaths("extract").duckdb)), read_only=True)
    try:
        rows = con.sql("SELECT source, line, output, pass, job, pass_1_output FROM cascade").pl()
    finally:
        con.close()
    assert rows.height == first.height
    assert rows.filter(pl.col("pass") == 2).height == wanted.height
    assert set(rows.filter(pl.col("pass") == 2)["job"]) == {"extract"}
    assert (rows.filter(pl.col("pass") == 1)["pass_1_output"] != "other").all()
    merged = rows.filter(pl.col("pass") == 2).join(second, on=["source", "line"])
    assert (merged["output"] == merged["output_right"]).all()
    # Dagster sees the chain: the second pass's manifest depends on the first pass's validated table
    defs = build_definitions([triage, extract], resources)
    graph = defs.resolve_asset_graph()
    assert dg.AssetKey(["triage", "validated"]) in graph.get(dg.AssetKey(["extract", "manifest"])).parent_keys


def test_a_changed_upstream_answer_reruns_one_downstream_request(
    sandbox, make_job, instance, resources, home, tmp_path
):
    # the second pass's template leaves the answer out: the request ID still carries it
    triage, extract = two_pass(make_job, where="output IN ('other', 'billing')", template="Ticket:\n{body}")
    store = Store(home)
    run_job(triage, instance, resources)
    run_job(extract, instance, resources)
    before_up, before_down = items(store, "triage"), items(store, "extract")
    billed = len(ledger_ids(sandbox))
    # one billing ticket is answered 'other' now (its subject changes; its body, all the second pass sees, not)
    first = validated(store, "triage")
    row = first.filter((pl.col("output") == "billing") & ~pl.col("is_duplicate")).row(0, named=True)
    path = tmp_path / "data" / "in" / "rows.jsonl"
    lines = path.read_text().splitlines()
    record = json.loads(lines[row["line"] - 1])
    record["subject"] += " [[sandbox:label=other]]"
    lines[row["line"] - 1] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")
    run_job(triage, instance, resources)
    assert validated(store, "triage").filter(pl.col("line") == row["line"])["output"].to_list() == ["other"]
    run_job(extract, instance, resources)
    new_up, new_down = items(store, "triage") - before_up, items(store, "extract") - before_down
    assert len(new_up) == 1 and len(new_down) == 1
    assert set(ledger_ids(sandbox)[billed:]) == new_up | new_down  # exactly one request re-ran in each pass
    again = validated(store, "extract").filter(pl.col("line") == row["line"])
    assert again["request_id"].to_list() == list(new_down)


def test_quote_share_of_the_second_pass_is_assumed_then_measured(sandbox, make_job, instance, resources, home):
    triage, extract = two_pass(make_job)
    store = Store(home)
    defs = build_definitions([triage], resources)
    dg.materialize(
        [*defs.assets, *defs.asset_checks],
        selection=[dg.AssetKey(["triage", "manifest"]), dg.AssetKey(["triage", "quote"])],
        instance=instance,
        resources=defs.resources,
    )
    quote = store.read_json(JobPaths("triage").quote)
    first, second = quote["cascade"]["passes"]
    assert (first["job"], first["requests"], second["job"]) == ("triage", 40, "extract")
    assert (second["share"], second["share_source"], second["requests"]) == (0.3, "assumed", 12)
    assert second["cost_expected"] > 0 and quote["cascade"]["total"]["expected"] > quote["est_cost_usd"]["expected"]
    run_job(triage, instance, resources)
    dg.materialize(
        [*defs.assets, *defs.asset_checks],
        selection=[dg.AssetKey(["triage", "quote"])],
        instance=instance,
        resources=defs.resources,
    )
    measured = store.read_json(JobPaths("triage").quote)["cascade"]["passes"][1]
    others = validated(store, "triage").filter(pl.col("output") == "other").height
    assert measured["share_source"] == "validated" and measured["measured_on"] == 40
    assert measured["share"] == pytest.approx(others / 40) and measured["requests"] == others
    # the second pass's own quote: its share from the upstream table, and the first pass as it left it
    run_job(extract, instance, resources)
    down = store.read_json(JobPaths("extract").quote)["cascade"]["passes"]
    assert [p["job"] for p in down] == ["triage", "extract"] and down[0]["spent_usd"] > 0
    assert down[1]["share_source"] == "validated" and down[1]["share"] == pytest.approx(others / 40)


def test_a_bad_where_column_is_a_config_error_naming_it(sandbox, make_job, instance, resources, home):
    triage, extract = two_pass(make_job, where="label = 'other'")
    run_job(triage, instance, resources)
    with pytest.raises(dg.Failure, match="no column 'label'"):
        run_job(extract, instance, resources)
    from batch_pipeline.core.manifest.upstream import checked_condition

    with pytest.raises(ConfigError, match="'label'") as err:
        checked_condition(extract)
    assert "output" in str(err.value)  # the columns it has


def drive(spec, instance, resources, sensor_ctx, limit: int = 40) -> list[dg.RunRequest]:
    """Tick the job's shard driver and run what it asks for until it has published (as the daemon would)."""
    driver = build_shard_sensor(spec, build_jobs(spec))
    runs: list[dg.RunRequest] = []
    for _ in range(limit * 10):
        requests = _requests(driver(sensor_ctx()))
        if not requests:
            time.sleep(0.1)  # provider batches still running
            continue
        for r in requests:
            runs.append(r)
            _execute(spec, instance, resources, r, "submit")
        if any(r.job_name == f"{spec.name}_publish" for r in requests):
            return runs
    raise AssertionError(f"job {spec.name} did not publish: {[(r.job_name, r.run_key) for r in runs]}")


def test_two_pass_job_through_the_sensors(sandbox, make_job, instance, resources, home):
    triage, extract = two_pass(make_job)
    store = Store(home)

    def ctx():
        return dg.build_sensor_context(instance=instance, resources=resources)

    upstream = build_upstream_sensor(extract, build_jobs(extract))
    skip = upstream(dg.build_sensor_context(instance=instance))
    assert isinstance(skip, dg.SkipReason) and "not been published" in skip.skip_message
    # pass 1: its new data starts it; the driver takes it to a publish
    [prepare] = _requests(build_new_data_sensor(triage, build_jobs(triage))(dg.build_sensor_context(instance=instance)))
    _execute(triage, instance, resources, prepare, "prepare")
    driver = build_shard_sensor(triage, build_jobs(triage))
    [canary] = _requests(driver(ctx()))
    _execute(triage, instance, resources, canary, "submit")
    for _ in range(100):
        collect = _requests(driver(ctx()))
        if collect:
            break
        time.sleep(0.1)
    for r in collect:
        _execute(triage, instance, resources, r, "collect")
    # after the canary, the quote measures the second pass's share on the answers so far
    defs = build_definitions([triage], resources)
    dg.materialize(
        [*defs.assets, *defs.asset_checks],
        selection=[dg.AssetKey(["triage", "quote"])],
        instance=instance,
        resources=defs.resources,
    )
    share = store.read_json(JobPaths("triage").quote)["cascade"]["passes"][1]
    assert share["share_source"] == "canary" and 0 < share["measured_on"] < 40
    drive(triage, instance, resources, ctx)
    # pass 1 published: the upstream sensor asks for pass 2's manifest run, once per publish
    ticked = dg.build_sensor_context(instance=instance)
    [start] = _requests(upstream(ticked))
    assert start.job_name is None or start.job_name == "extract_prepare"
    assert start.run_key.startswith("prepare:triage:")
    assert _requests(upstream(dg.build_sensor_context(instance=instance, cursor=ticked.cursor))) == []
    _execute(extract, instance, resources, start, "prepare")
    drive(extract, instance, resources, ctx)
    wanted = validated(store, "triage").filter(pl.col("output") == "other")
    assert sorted(validated(store, "extract")["line"]) == sorted(wanted["line"])
    assert store.read_json(JobPaths("extract").report)["complete"]
