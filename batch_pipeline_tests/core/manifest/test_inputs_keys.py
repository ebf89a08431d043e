"""Numeric source keys stay on the column-wise path and come out as text."""

import json

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.json as pajson

from batch_pipeline.core.manifest.inputs import read_batches
from batch_pipeline.core.manifest.jsonl import _read_block
from batch_pipeline.core.manifest.rows import InputFile


def test_numeric_key_block_parses_column_wise_as_text():
    data = b"\n".join(json.dumps({"id": i, "body": f"text {i}"}).encode() for i in range(5))
    options = pajson.ParseOptions(
        explicit_schema=pa.schema([("body", pa.string()), ("id", pa.string())]), unexpected_field_behavior="ignore"
    )
    table = _read_block(data, options, "id")
    assert table.column("id").type == pa.string()
    assert table.column("id").to_pylist() == ["0", "1", "2", "3", "4"]


def test_numeric_key_rows_keep_their_keys_and_lines(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"id": i, "body": f"text {i}"}) + "\n" for i in range(50)))
    f = InputFile(str(path), pafs.LocalFileSystem(), str(path), "jsonl", path.stat().st_size)
    batches = list(read_batches(f, ["body"], "id"))
    frame = batches[0].frame
    assert batches[0].rejects == []
    assert frame["_key"].to_list() == [str(i) for i in range(50)]
    assert frame["_line"].to_list() == list(range(1, 51))
