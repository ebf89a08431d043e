"""Numeric source keys stay on the column-wise path and come out as text."""

import json

from batch_pipeline.core import inputs
from batch_pipeline.core.inputs import InputFile, read_batches


def test_numeric_key_is_read_column_wise_as_text(tmp_path, monkeypatch):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"id": i, "body": f"text {i}"}) + "\n" for i in range(50)))
    calls = []
    monkeypatch.setattr(inputs, "_jsonl_slow", lambda *a, **k: calls.append(a) or None)  # must not be needed
    import pyarrow.fs as pafs

    f = InputFile(str(path), pafs.LocalFileSystem(), str(path), "jsonl", path.stat().st_size)
    batches = list(read_batches(f, ["body"], "id"))
    assert calls == []
    frame = batches[0].frame
    assert frame["_key"].to_list() == [str(i) for i in range(50)]
    assert frame["_line"].to_list() == list(range(1, 51))
