"""Result-file parsing: the column-wise path, its per-line fallback, and parallel parsing of a stream."""

import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batch_pipeline.core.ledger.executor import RequestPlan, ShardWork
from batch_pipeline.core.ledger.result_parts import write_results
from batch_pipeline.core.run.results import build_results
from batch_pipeline.core.spec.loading import parse_spec
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline.executors.openai.format import _parse_fast, _parse_lines, parse_output_block, parse_output_stream

SPEC = """
name: fmt
input: {path: in.jsonl, text_field: body}
prompt: {version: v1, template: "{body}"}
model: gpt-4o-mini
backend: {name: openai_batch, settings: {sandbox: true}}
sampling: {max_tokens: 8}
output: {choice: [bug, other]}
"""


def _line(i: int) -> dict:
    kind = i % 4
    if kind == 3:
        return {
            "id": f"r{i}",
            "custom_id": f"c{i}",
            "response": None,
            "error": {"code": "batch_expired", "message": "expired"},
        }
    if kind == 2:
        return {
            "id": f"r{i}",
            "custom_id": f"c{i}",
            "error": None,
            "response": {
                "status_code": 500,
                "request_id": f"q{i}",
                "body": {"error": {"message": "boom", "type": "server_error", "code": None}},
            },
        }
    message = {
        "role": "assistant",
        "content": json.dumps({"label": "bug"}) if kind == 0 else None,
        "refusal": None if kind == 0 else "I can't help with that",
    }
    return {
        "id": f"r{i}",
        "custom_id": f"c{i}",
        "error": None,
        "response": {
            "status_code": 200,
            "request_id": f"q{i}",
            "body": {
                "id": f"cc{i}",
                "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
                "usage": {
                    "prompt_tokens": 10 + i,
                    "completion_tokens": 3,
                    "prompt_tokens_details": {"cached_tokens": i % 5},
                },
            },
        },
    }


def _file(n: int) -> bytes:
    return "".join(json.dumps(_line(i), ensure_ascii=False) + "\n" for i in range(n)).encode()


def test_the_column_wise_path_gives_the_per_line_paths_table():
    block = _file(200)
    fast = _parse_fast(block)
    assert fast is not None, "a clean block takes the column-wise path"
    assert fast.equals(_parse_lines(block))
    by = {r["request_id"]: r for r in fast.to_pylist()}
    assert by["c0"]["output_text"] == '{"label": "bug"}' and by["c0"]["cached_tokens"] == 0
    assert by["c1"]["error_message"] == "refused: I can't help with that"
    assert by["c2"]["http_status"] == 500 and by["c2"]["error_code"] == "server_error"
    assert by["c3"]["error_code"] == "batch_expired" and by["c3"]["http_status"] is None
    assert json.loads(by["c5"]["raw_payload"]) == _line(5)  # the provider's line, verbatim, without its newline


@pytest.mark.parametrize("kinds", [(0,), (2, 3), (1,), (0, 1, 2, 3)], ids=["answered", "errors", "refusals", "mixed"])
def test_answered_lines_and_the_rest_take_their_own_queries_and_keep_their_order(kinds):
    """Answered lines are read with 10 JSON paths, the others (errors, refusals) with all 14, then merged."""
    block = "".join(json.dumps(_line(i)) + "\n" for i in range(400) if i % 4 in kinds).encode()
    fast = _parse_fast(block)
    assert fast is not None and fast.equals(_parse_lines(block))
    assert fast.column("request_id").to_pylist() == [f"c{i}" for i in range(400) if i % 4 in kinds]


def test_a_line_that_is_not_utf8_sinks_only_itself():
    lines = _file(6).split(b"\n")
    lines[2] = lines[2].replace(b'"c2"', b'"c\xff2"')
    block = b"\n".join(lines)
    assert _parse_fast(block) is None  # DuckDB refuses the bytes; the per-line path takes the block
    rows = parse_output_block(block).to_pylist()
    assert [r["request_id"] for r in rows if r["error_code"] != "unparseable_line"] == ["c0", "c1", "c3", "c4", "c5"]
    bad = [r for r in rows if r["error_code"] == "unparseable_line"]
    assert len(bad) == 1 and "\ufffd" in bad[0]["raw_payload"] and "UTF-8" in bad[0]["error_message"]


def test_a_stream_parsed_on_several_threads_keeps_file_order():
    data = _file(3000)
    rng = random.Random(7)
    cuts = sorted(rng.sample(range(1, len(data)), 60))
    chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]  # arbitrary cuts, mid-line too
    serial = pa.concat_tables(parse_output_stream(iter(chunks), workers=1, block_bytes=20_000))
    parallel = list(parse_output_stream(iter(chunks), workers=3, block_bytes=20_000))
    assert len(parallel) > 10
    assert pa.concat_tables(parallel).equals(serial)
    assert serial.column("request_id").to_pylist() == [f"c{i}" for i in range(3000)]


def test_result_parts_store_the_ids_with_zstd_the_rest_with_lz4_and_the_raw_lines_beside_them(tmp_path):
    spec = parse_spec(SPEC)
    raw = parse_output_block(_file(50))
    work = ShardWork("fmt", "s00001", 1, "fmt:s00001:1", RequestPlan.from_spec(spec), raw.select(["request_id"]))
    table = build_results(
        raw, work, backend="openai_batch", pricing="batch", prompt_version="v1", price=None, provider_batch_id="b1"
    )
    store = Store(tmp_path)
    rel = write_results(store, "fmt", "s00001", 1, 1, table)
    meta = pq.ParquetFile(store.local_path(rel)).metadata.row_group(0)
    codecs = {meta.column(i).path_in_schema: meta.column(i).compression for i in range(meta.num_columns)}
    assert codecs["request_id"] == "ZSTD" and codecs["output_text"] == "LZ4" and "raw_payload" not in codecs
    assert store.read_part(rel).equals(table.drop_columns(["raw_payload"]))
    assert (
        store.read_part(JobPaths("fmt").payload_part(rel), ["raw_payload"])
        .column(0)
        .equals(table.column("raw_payload"))
    )  # the provider's lines, in their own part


def test_an_answer_that_also_carries_a_refusal_keeps_the_refusal():
    line = _line(0)
    line["response"]["body"]["choices"][0]["message"]["refusal"] = "partly refused"
    block = (json.dumps(_line(4)) + "\n" + json.dumps(line) + "\n").encode()
    fast = _parse_fast(block)
    assert fast is not None and fast.equals(_parse_lines(block))
    assert fast.column("error_message").to_pylist() == [None, "refused: partly refused"]
