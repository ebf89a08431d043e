"""Job specs end to end through Dagster ``materialize()`` on real vLLM (the tiny model, in this process)."""

import json

import dagster as dg
import jsonschema
import polars as pl
import pyarrow as pa
import pytest

from batch_pipeline.core.ledger.control import JobControl
from batch_pipeline.core.ledger.executor import RequestPlan, ShardWork
from batch_pipeline.core.ledger.result_parts import read_results
from batch_pipeline.core.manifest.shards import build_manifest
from batch_pipeline.core.run.runner import ShardRunner
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline.defs.pipeline import run_job
from batch_pipeline.executors.registry import create_executor
from batch_pipeline.executors.vllm.engine import VllmSettings, load_engine
from batch_pipeline.executors.vllm.offline import VllmOfflineExecutor
from batch_pipeline.executors.vllm.prompts import order_items

from .conftest import JSON_SCHEMA, LABELS, truncating


def _validated(home, job: str) -> pl.DataFrame:
    return pl.read_parquet(Store(home).local_path(JobPaths(job).validated))


def test_choice_job_gives_valid_labels_and_hits_the_prefix_cache(make_job, instance, resources, home):
    spec = make_job("vchoice")
    report = run_job(spec, instance, resources)
    assert report["complete"] and report["succeeded"] == report["unique_requests"] == 40
    assert report["invalid"] == report["missing"] == report["dead_lettered"] == 0
    table = _validated(home, "vchoice")
    assert table.height == 40
    assert set(table["output"]) <= set(LABELS)
    assert set(table["output_text"]) <= set(LABELS)  # the bare label, not {"label": ...}
    assert set(table["backend"]) == {"vllm"} and set(table["pricing"]) == {"self_hosted"}
    results = read_results(Store(home), "vchoice")
    assert results.height == 40 and set(results["status"]) == {"succeeded"}
    # the ~400-token system prompt is shared: after the first request of a shard every request hits the cache
    assert report["cached_tokens"] > 0
    assert (results["cached_tokens"] >= 256).sum() >= 36
    assert (results["cached_tokens"] < results["input_tokens"]).all()
    # flushed every 4 items: a shard of 10 wrote parts of 4, 4 and 2
    parts = Store(home).list_files(
        f"{JobPaths('vchoice').results}/{results['shard_id'][0]}", recursive=True, suffix=".parquet"
    )
    assert len(parts) == 3


def test_json_schema_job_outputs_all_validate(make_job, instance, resources, home):
    spec = make_job("vjson", output={"json_schema": JSON_SCHEMA}, sampling={"temperature": 0, "max_tokens": 40})
    report = run_job(spec, instance, resources)
    assert report["complete"] and report["succeeded"] == 40
    table = _validated(home, "vjson")
    assert table.height == 40
    validator = jsonschema.Draft202012Validator(JSON_SCHEMA)
    for text in table["output_text"]:
        assert " " not in text  # compact JSON: no free whitespace
        validator.validate(json.loads(text))


def test_length_finish_is_retried_then_dead_lettered(make_job, instance, resources, home):
    # max_tokens 3 cannot fit {"label":"bug","urgent":false} (about 9 tokens): the spec would not load, so it is
    # loaded with 40 and shrunk afterwards (conftest.truncating). No canary: with one, a job that truncates
    # everything stops after the canary (the next test); this one is about the retry path of every item.
    spec = truncating(
        make_job(
            "vlength",
            output={"json_schema": JSON_SCHEMA},
            sampling={"temperature": 0, "max_tokens": 40},
            retries={"per_item": 2, "spend_cap_share": 1.0},
            canary_first=False,
        ),
        3,
    )
    report = run_job(spec, instance, resources)
    assert report["succeeded"] == 0 and report["dead_lettered"] == 40 and report["complete"]
    results = read_results(Store(home), "vlength")
    assert results.height == 80  # every item tried twice, then given up
    assert set(results["attempt"]) == {1, 2}
    assert set(results["finish_reason"]) == {"length"} and set(results["error_code"]) == {"truncated"}
    assert set(results["status"]) == {"invalid"}
    dead = pl.read_parquet(Store(home).local_path(JobPaths("vlength").dead_letters))
    assert dead.height == 40 and set(dead["last_error_code"]) == {"truncated"}
    assert _validated(home, "vlength").height == 0


def test_a_truncating_canary_stops_the_job_before_the_other_shards(make_job, instance, resources, home):
    # the same truncating spec with the default canary: only the first shard's sample (its 10 items) is sent,
    # once; every answer is cut off, so the structural failure rate (1.0) is over canary.max_failure_rate
    spec = truncating(
        make_job(
            "vcanary",
            output={"json_schema": JSON_SCHEMA},
            sampling={"temperature": 0, "max_tokens": 40},
            retries={"per_item": 2},
        ),
        3,
    )
    with pytest.raises(dg.Failure, match="canary"):
        run_job(spec, instance, resources)
    store = Store(home)
    assert JobControl(store, "vcanary").current().code == "canary_failed"
    verdict = store.read_json(JobPaths("vcanary").canary_verdict)
    assert not verdict["passed"] and verdict["failure_rate"] == 1.0 and verdict["items"] == 10
    results = read_results(store, "vcanary")
    assert results.height == 10 and set(results["attempt"]) == {1} and results["shard_id"].n_unique() == 1
    assert set(results["finish_reason"]) == {"length"} and set(results["error_code"]) == {"truncated"}


def test_runner_flushes_and_the_executor_reports_metrics(make_job, home):
    spec = make_job("vmetrics", settings={"flush_every": 3, "preflight_longest": 2})
    store = Store(home)
    build_manifest(spec, store)
    executor = create_executor(spec.backend)
    assert isinstance(executor, VllmOfflineExecutor)
    runner = ShardRunner(spec, store, executor, None, executor.pricing)
    shard = runner.manifest.shard_ids()[0]
    out = runner.run_stream(shard)
    assert out.rows == out.succeeded == 10
    parts = store.list_files(f"{JobPaths('vmetrics').results}/{shard}", recursive=True, suffix=".parquet")
    assert len(parts) == 4  # 10 items flushed every 3
    m = executor.metrics[shard]
    assert m is executor.last_metrics
    assert m["items"] == 10 and m["generated_tokens"] >= 10 and m["prompt_tokens"] > m["cached_tokens"] > 0
    assert 0 < m["engine_s"] <= m["wall_s"] and m["tokens_per_s"] > 0
    assert set(m["finish_reasons"]) == {"stop"} and not m["interrupted"]
    assert runner.run_stream(shard).rows == 0  # nothing left: nothing sent


def test_too_long_prompt_is_a_poison_row_not_a_crash(make_job, tiny_model):
    spec = make_job("vlong")
    executor = create_executor(spec.backend)
    plan = RequestPlan.from_spec(spec)
    items = pa.table({"request_id": ["short", "long"], "user_prompt": ["my invoice is wrong", "invoice " * 2000]})
    tables = list(executor.run(ShardWork("vlong", "s", 1, "vlong:s:1", plan, items)))
    rows = {r["request_id"]: r for t in tables for r in t.to_pylist()}
    assert rows["short"]["http_status"] == 200 and rows["short"]["output_text"] in LABELS
    assert rows["long"]["http_status"] == 400 and rows["long"]["error_code"] == "context_length_exceeded"


def test_a_large_shard_goes_into_the_engine_a_window_at_a_time(make_job):
    # a waiting request holds memory in the engine (its tokens, its grammar matcher): a shard is handed over at
    # most twice max_num_seqs at a time, topped up as answers come out, and every item is still answered once
    spec = make_job("vwindow", settings={"flush_every": 16})
    engine = load_engine(VllmSettings.model_validate(spec.backend.settings)).llm_engine
    window = 2 * engine.vllm_config.scheduler_config.max_num_seqs
    n = window + 200
    items = pa.table(
        {
            "request_id": [f"w{i:04d}" for i in range(n)],
            "user_prompt": [f"Subject: ticket {i}\nTicket:\nmy invoice {i} is wrong" for i in range(n)],
        }
    )
    work = ShardWork("vwindow", "s", 1, "vwindow:s:1", RequestPlan.from_spec(spec), items)
    in_engine, answered = [], []
    for table in create_executor(spec.backend).run(work):
        in_engine.append(engine.get_num_unfinished_requests())  # at each flush of 16 results
        answered += table.column("request_id").to_pylist()
    assert sorted(answered) == items.column("request_id").to_pylist()
    assert 0 < max(in_engine) <= window, in_engine
    assert in_engine[-1] == 0


def test_items_run_in_length_buckets_after_a_preflight_of_the_longest():
    lengths = [5, 300, 40, 41, 290, 7, 100, 33]
    first, rest = order_items(lengths, bucket_tokens=32, seed=1, preflight=2)
    assert first == [1, 4]
    assert sorted(first + rest) == list(range(8))
    buckets = [lengths[i] // 32 for i in rest]
    assert buckets == sorted(buckets, reverse=True)
    assert order_items(lengths, 32, 1, 2) == (first, rest)  # seeded: the same order every time
