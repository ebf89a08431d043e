"""Result storage: a result part of parsed columns and a payload part of the provider's lines, one name for both."""

import json
import logging
from concurrent.futures import Future

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batch_pipeline.core.ledger.executor import RAW_RESULT_SCHEMA, RequestPlan, ShardWork, raw_table
from batch_pipeline.core.ledger.result_parts import (
    PART_SCHEMA,
    PAYLOAD_SCHEMA,
    RESULT_SCHEMA,
    new_part,
    read_results,
    write_part,
    write_payload,
    write_results,
)
from batch_pipeline.core.run.results import build_results
from batch_pipeline.core.spec.loading import parse_spec
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store

SPEC = """
name: res
input: {path: in.jsonl, text_field: body}
prompt: {version: v1, template: "{body}"}
model: gpt-4o-mini
backend: {name: openai_batch}
sampling: {max_tokens: 8}
output: {choice: [bug, other]}
"""


def _raw(ids: list[str]) -> pa.Table:
    rows = [
        (
            rid,
            200,
            json.dumps({"label": "bug"}),
            "stop",
            10,
            0,
            2,
            None,
            None,
            f"req_{rid}",
            json.dumps({"custom_id": rid, "line": i}),
        )
        for i, rid in enumerate(ids)
    ]
    return raw_table(rows)


def _table(ids: list[str], attempt: int = 1) -> pa.Table:
    spec = parse_spec(SPEC)
    work = ShardWork(
        "res", "s00001", attempt, f"res:s00001:{attempt}", RequestPlan.from_spec(spec), pa.table({"request_id": ids})
    )
    return build_results(
        _raw(ids),
        work,
        backend="openai_batch",
        pricing="batch",
        prompt_version="v1",
        price=None,
        provider_batch_id="b1",
    )


def _codecs(path) -> dict[str, str]:
    meta = pq.ParquetFile(path).metadata.row_group(0)
    return {meta.column(i).path_in_schema: meta.column(i).compression for i in range(meta.num_columns)}


def test_a_flush_is_a_result_part_without_the_payload_and_a_payload_part_beside_it(tmp_path):
    store = Store(tmp_path)
    table = _table(["a", "b", "c"])
    rel = write_results(store, "res", "s00001", 1, 1, table)
    payload_rel = JobPaths("res").payload_part(rel)
    assert payload_rel.startswith("jobs/res/payloads/s00001/") and payload_rel.endswith(rel.rsplit("/", 1)[1])
    part = store.read_part(rel)
    assert part.schema == PART_SCHEMA and part.equals(table.select(PART_SCHEMA.names))
    payload = store.read_part(payload_rel)
    assert payload.schema == PAYLOAD_SCHEMA
    assert payload.column("request_id").to_pylist() == ["a", "b", "c"]  # row for row beside the result part
    assert payload.column("raw_payload").equals(table.column("raw_payload"))
    codecs = _codecs(store.local_path(rel))
    assert codecs["request_id"] == "ZSTD" and codecs["output_text"] == "LZ4" and "raw_payload" not in codecs
    assert _codecs(store.local_path(payload_rel))["raw_payload"] == "ZSTD"  # level -7 (PAYLOAD_OPTIONS)


def test_the_payload_is_read_only_when_asked_for_and_then_matches_its_row(tmp_path):
    store = Store(tmp_path)
    write_results(store, "res", "s00001", 1, 1, _table(["a", "b"]))
    write_results(store, "res", "s00001", 2, 1, _table(["b"], attempt=2))
    hot = read_results(store, "res", columns=["status"])
    assert hot.columns == ["request_id", "attempt", "status"]
    everything = read_results(store, "res")
    assert everything.columns == RESULT_SCHEMA.names and everything.height == 3
    for row in everything.iter_rows(named=True):
        assert json.loads(row["raw_payload"])["custom_id"] == row["request_id"]
    # the payload parts gone: every hot read still works, the payload reads as missing (null), not as an error
    for rel in store.list_files(JobPaths("res").payloads, recursive=True):
        store.delete(rel)
    assert read_results(store, "res", columns=["status"]).equals(hot)
    assert read_results(store, "res", columns=["raw_payload"])["raw_payload"].null_count() == 3


def test_result_parts_written_before_the_split_give_their_own_payload(tmp_path):
    store = Store(tmp_path)
    old = _table(["old"])
    store.write_table(JobPaths("res").result_part("s00001", 1, 1, "old00000"), old)  # payload inside, no sibling
    write_results(store, "res", "s00002", 1, 1, _table(["new"]))
    frame = read_results(store, "res")
    by = {r["request_id"]: r for r in frame.iter_rows(named=True)}
    assert json.loads(by["old"]["raw_payload"])["custom_id"] == "old"
    assert json.loads(by["new"]["raw_payload"])["custom_id"] == "new"
    assert read_results(store, "res", shard_id="s00001", columns=["status", "raw_payload"]).height == 1


def test_a_re_collected_attempt_reads_once_with_one_payload(tmp_path):
    store = Store(tmp_path)
    write_results(store, "res", "s00001", 1, 1, _table(["a", "b"]))
    write_results(store, "res", "s00001", 1, 1, _table(["a", "b"]))  # the same batch collected again
    frame = read_results(store, "res", columns=["raw_payload"])
    assert sorted(frame["request_id"].to_list()) == ["a", "b"] and frame["raw_payload"].null_count() == 0


def test_a_torn_payload_part_is_skipped_and_its_rows_keep_their_results(tmp_path, caplog):
    store = Store(tmp_path)
    rel = write_results(store, "res", "s00001", 1, 1, _table(["a"]))
    write_results(store, "res", "s00001", 1, 2, _table(["b"]))
    store.write_bytes(JobPaths("res").payload_part(rel), b"PAR1 torn")
    with caplog.at_level(logging.WARNING, logger="batch_pipeline.core.store"):
        frame = read_results(store, "res", columns=["status", "raw_payload"]).sort("request_id")
    assert frame["status"].to_list() == ["succeeded", "succeeded"]
    assert frame["raw_payload"].is_null().to_list() == [True, False]
    assert any("torn" in r.getMessage() for r in caplog.records)


def test_a_result_part_does_not_land_when_its_payload_write_failed(tmp_path):
    store = Store(tmp_path)
    table = _table(["a"])
    rel = new_part("res", "s00001", 1, 1)
    failed: Future = Future()
    failed.set_exception(OSError("disk full"))
    with pytest.raises(OSError, match="disk full"):
        write_part(store, rel, table, failed)
    assert not store.exists(rel)
    done: Future = Future()
    done.set_result(None)
    write_payload(store, "res", rel, 1, table)
    write_part(store, rel, table, done)
    assert (
        read_results(store, "res", columns=["raw_payload"])["raw_payload"].to_list()
        == table.column("raw_payload").to_pylist()
    )


def test_an_empty_store_reads_as_an_empty_table_of_every_column(tmp_path):
    frame = read_results(Store(tmp_path), "res")
    assert frame.height == 0 and frame.columns == RESULT_SCHEMA.names
    assert frame.schema["raw_payload"] == pl.String
    assert RAW_RESULT_SCHEMA.field("raw_payload") == RESULT_SCHEMA.field("raw_payload")
