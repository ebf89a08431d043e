"""The OpenAI batch file format with vLLM: our request file runs on vLLM's ``run_batch`` and its output ingests;
published results export as an OpenAI batch output (and error) file."""

import json
import subprocess

import polars as pl

from batch_pipeline.core.ledger.executor import RequestPlan, ShardWork
from batch_pipeline.core.manifest.shards import Manifest, build_manifest
from batch_pipeline.core.quality.validate import validate
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline.defs.pipeline import run_job
from batch_pipeline.executors.openai.export import export_openai_batch_errors, export_openai_batch_output
from batch_pipeline.executors.openai.format import parse_output_block, request_lines
from batch_pipeline_tests.sandbox.support import validate_spec

from .conftest import JSON_SCHEMA, LABELS, MODEL, PY, python_env, truncating


def test_vllm_run_batch_runs_our_request_file_and_its_output_ingests(make_job, home, tiny_model, tmp_path):
    spec = make_job("vrunbatch")
    store = Store(home)
    build_manifest(spec, store)
    manifest = Manifest(spec.name, store)
    shard = manifest.shard_ids()[0]
    items = manifest.shard_items(shard, ["request_id", "user_prompt"])
    work = ShardWork(spec.name, shard, 1, f"{spec.name}:{shard}:1", RequestPlan.from_spec(spec), items)
    (tmp_path / "in.jsonl").write_bytes(request_lines(work))
    argv = [
        PY,
        "-m",
        "vllm.entrypoints.openai.run_batch",
        "-i",
        str(tmp_path / "in.jsonl"),
        "-o",
        str(tmp_path / "out.jsonl"),
        "--model",
        str(tiny_model),
        "--served-model-name",
        MODEL,
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-model-len",
        "1024",
        "--kv-cache-memory-bytes",
        str(256 * 2**20),
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--distributed-executor-backend",
        "uni",
        "--structured-outputs-config",
        json.dumps({"backend": "xgrammar", "disable_any_whitespace": True}),
    ]
    proc = subprocess.run(
        argv, env=python_env(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1"), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    raw = parse_output_block((tmp_path / "out.jsonl").read_bytes())
    assert sorted(raw.column("request_id").to_pylist()) == sorted(work.request_ids)
    verdicts = validate(raw, spec.output)
    assert set(verdicts.status.to_pylist()) == {"succeeded"}
    assert set(verdicts.parsed_output.to_pylist()) <= set(LABELS)
    assert all(t > 0 for t in raw.column("input_tokens").to_pylist())


def test_validated_results_export_as_an_openai_batch_output_file(make_job, instance, resources, home, tmp_path):
    spec = make_job("vexport", output={"json_schema": JSON_SCHEMA}, sampling={"temperature": 0, "max_tokens": 40})
    assert run_job(spec, instance, resources)["succeeded"] == 40
    store = Store(home)
    validated = pl.read_parquet(store.local_path(JobPaths(spec.name).validated))
    out = tmp_path / "export" / "output.jsonl"
    assert export_openai_batch_output(validated, out, created=1_780_000_000) == 40
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [x["custom_id"] for x in lines] == validated["source_key"].to_list()  # the tickets' own IDs
    for line in lines:
        assert line["error"] is None and line["response"]["status_code"] == 200
        validate_spec("CreateChatCompletionResponse", line["response"]["body"])
    # the file reads back through our own OpenAI output parser: same texts and token counts
    raw = parse_output_block(out.read_bytes())
    back = dict(zip(raw.column("request_id").to_pylist(), raw.column("output_text").to_pylist(), strict=True))
    assert back == dict(zip(validated["source_key"], validated["output_text"], strict=True))
    assert raw.column("input_tokens").to_pylist() == validated["input_tokens"].to_list()
    assert raw.column("cached_tokens").to_pylist() == validated["cached_tokens"].to_list()


def test_dead_letters_export_as_an_openai_batch_error_file(make_job, instance, resources, home, tmp_path):
    # every item truncated (max_tokens 2), so every item is a dead letter. The spec loads with a max_tokens that
    # fits the contract and is shrunk afterwards (conftest.truncating); no canary, which would stop the job
    # after the first shard's sample instead of dead-lettering all 40
    spec = truncating(
        make_job(
            "vexporterr",
            output={"json_schema": JSON_SCHEMA},
            sampling={"temperature": 0, "max_tokens": 40},
            retries={"per_item": 1},
            canary_first=False,
        ),
        2,
    )
    assert run_job(spec, instance, resources)["dead_lettered"] == 40
    dead = pl.read_parquet(Store(home).local_path(JobPaths(spec.name).dead_letters))
    path = tmp_path / "errors.jsonl"
    assert export_openai_batch_errors(dead, path) == 40
    raw = parse_output_block(path.read_bytes())
    assert sorted(raw.column("request_id").to_pylist()) == sorted(dead["request_id"].to_list())
    assert set(raw.column("error_code").to_pylist()) == {"truncated"}
