"""Bad rows go to rejects with their file, line and kind; the good rows around them are kept.

Each fault is tested alone among clean rows (the block would otherwise take Arrow's fast path) and all
together (the block takes the line-by-line path), so both code paths have to classify it.
"""

import json

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batch_pipeline.core.errors import InputError
from batch_pipeline.core.manifest import rows as manifest_rows
from batch_pipeline.core.manifest.inputs import read_batches, resolve_inputs
from batch_pipeline.core.manifest.shards import Manifest, build_manifest
from batch_pipeline.core.spec.loading import load_spec
from batch_pipeline.core.store import Store
from batch_pipeline_tests.core.helpers import base_spec_dict, write_jsonl, write_spec


def good(i: int) -> dict:
    return {"id": f"g{i}", "body": f"good row number {i}", "extra": [1, {"x": None}]}


FAULTS = {
    "bad_json": (b'{"id": "b1", "body": "cut off', "bad_json", ""),
    "missing_field": ({"id": "b2", "subject": "no body here"}, "missing_field", "body"),
    "empty_text": ({"id": "b3", "body": ""}, "empty_text", "body"),
    "whitespace_text": ({"id": "b4", "body": " \t\xa0\u2028\n "}, "empty_text", "body"),
    "number": ({"id": "b5", "body": 12345}, "wrong_type", "body"),
    "list": ({"id": "b6", "body": ["a", "b"]}, "wrong_type", "body"),
    "bool": ({"id": "b7", "body": True}, "wrong_type", "body"),
    "not_object": (b'["id", "b8"]', "not_object", ""),
    "bad_utf8": (b'{"id": "b9", "body": "Caf\xe9 ol\xe9 \xff"}', "bad_utf8", ""),
}


def read_all(path, fields=("body",), key="id"):
    [f] = resolve_inputs(str(path))
    frames, rejects = [], []
    for batch in read_batches(f, list(fields), key):
        frames.append(batch.frame)
        rejects.extend(batch.rejects)
    frame = pl.concat(frames) if frames else pl.DataFrame()
    return frame, rejects


@pytest.mark.parametrize("fault", list(FAULTS))
def test_each_fault_alone_among_clean_rows(fault, tmp_path):
    row, kind, field = FAULTS[fault]
    lines = [good(1), good(2), row, good(4), good(5)]
    path = write_jsonl(tmp_path / "in.jsonl", lines)
    frame, rejects = read_all(path)
    pre_normalisation = kind != "empty_text"  # empty text is rejected after normalisation, in the manifest
    if pre_normalisation:
        assert [(r.source, r.line, r.kind, r.field) for r in rejects] == [(str(path), 3, kind, field)]
        assert frame["_line"].to_list() == [1, 2, 4, 5]
        assert frame["_key"].to_list() == ["g1", "g2", "g4", "g5"]
        assert frame["body"].to_list() == [good(i)["body"] for i in (1, 2, 4, 5)]

    # and through the manifest: the summary counts match the rejects table
    spec = write_spec(tmp_path / "job", base_spec_dict(str(path)))
    store = Store(tmp_path / "store")
    summary = build_manifest(spec, store)
    table = Manifest("t", store).rejects().to_pylist()
    assert [(r["source"], r["line"], r["kind"], r["field"]) for r in table] == [(str(path), 3, kind, field)]
    assert table[0]["reason"]
    assert (summary.input_rows, summary.rejected_rows, summary.accepted_rows) == (5, 1, 4)
    assert summary.rejects_by_reason == {kind: 1}
    rows = Manifest("t", store).rows().to_pylist()
    assert [r["line"] for r in rows] == [1, 2, 4, 5]


def test_all_faults_in_one_block_with_blank_lines_and_crlf(tmp_path):
    lines: list = []
    expected = []
    for i, (row, kind, field) in enumerate(FAULTS.values()):
        lines.append(good(i))
        lines.append(row)
        expected.append((2 * i + 2, kind, field))
    n = len(lines)
    path = tmp_path / "in.jsonl"
    write_jsonl(path, lines)
    # a blank line and a CRLF line at the end still count as lines
    with open(path, "ab") as fh:
        fh.write(b"\n" + json.dumps(good(100)).encode() + b"\r\n")
    spec = write_spec(tmp_path / "job", base_spec_dict(str(path)))
    store = Store(tmp_path / "store")
    summary = build_manifest(spec, store)
    table = Manifest("t", store).rejects().to_pylist()
    assert sorted((r["line"], r["kind"], r["field"]) for r in table) == expected
    assert {r["source"] for r in table} == {str(path)}
    rows = Manifest("t", store).rows().to_pylist()
    assert [r["line"] for r in rows] == [*range(1, n + 1, 2), n + 2]
    assert [r["source_key"] for r in rows] == [f"g{i}" for i in range(len(FAULTS))] + ["g100"]
    assert summary.rejected_rows == len(FAULTS)
    assert summary.accepted_rows == len(FAULTS) + 1
    assert summary.input_rows == summary.rejected_rows + summary.accepted_rows
    assert sum(summary.rejects_by_reason.values()) == summary.rejected_rows
    assert summary.rejects_by_reason == {
        k: sum(1 for _, kind, _ in FAULTS.values() if kind == k) for k in {kind for _, kind, _ in FAULTS.values()}
    }


@pytest.mark.parametrize(
    "line,reason",
    [
        (
            b'{"id": "b1", "body": "cut off',
            "bad JSON: a string that starts at column 22 never ends (the line is cut off, "
            "or a closing quote is missing)",
        ),
        (
            b'{"id": "b1", "body": "x",}',
            "bad JSON: expected a key in double quotes at column 26 (a trailing comma, or a key in single quotes?)",
        ),
        (
            b'{"id": "b1", "body": "x"',
            "bad JSON: the line ends at column 25 before the JSON value is complete (cut off?)",
        ),
        (b'{"id": "b1" "body": "x"}', "bad JSON: a comma is missing between two values, at column 13"),
        (
            b'{"id": "b1"} {"body": "x"}',
            "bad JSON: more text after the JSON value ends, at column 14 (two objects on one line?)",
        ),
        (b'{"id": "b1", "body": 12345}', "field 'body' must be a string, got a number"),
        (b'["id", "b8"]', "expected a JSON object, got a list"),
    ],
)
def test_reject_reasons_read_as_plain_english(line, reason, tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", [good(1), line])
    _, rejects = read_all(path)
    assert [r.reason for r in rejects] == [reason]
    assert " at at " not in reason and "Expecting" not in reason and "int" not in reason.split()


def test_null_field_is_classified_the_same_whatever_its_neighbours(tmp_path):
    """A ``"body": null`` row must get one reject kind, not one that depends on whether another line of the
    same 8 MB block happens to be broken (fast Arrow path vs line-by-line path)."""
    alone = write_jsonl(tmp_path / "alone.jsonl", [good(1), {"id": "n", "body": None}])
    with_bad = write_jsonl(tmp_path / "with_bad.jsonl", [good(1), {"id": "n", "body": None}, b"{broken"])
    _, r1 = read_all(alone)
    _, r2 = read_all(with_bad)
    assert [(r.line, r.field) for r in r1] == [(2, "body")]
    assert [(r.line, r.field) for r in r2 if r.line == 2] == [(2, "body")]
    assert r1[0].kind == [r for r in r2 if r.line == 2][0].kind


def test_sample_data_rejects_match_the_generator_summary(sample_data, tmp_path):
    root, samples = sample_data
    spec = load_spec(root / "data" / "jobs" / "demo.yaml")
    store = Store(tmp_path / "store")
    summary = build_manifest(spec, store)
    kind_of = {
        "broken_json": "bad_json",
        "missing_body": "missing_field",
        "empty_body": "empty_text",
        "whitespace_body": "empty_text",
        "invalid_utf8": "bad_utf8",
        "numeric_body": "wrong_type",
    }
    expected = set()
    for name, info in samples["files"].items():
        path = str(root / "data" / "samples" / "tickets" / name)
        expected |= {(path, m["line"], kind_of[m["kind"]]) for m in info["malformed"]}
        expected |= {(path, line, "too_long") for line in info["over_long_lines"]}
    got = [(r["source"], r["line"], r["kind"]) for r in Manifest("demo", store).rejects().to_pylist()]
    assert len(got) == len(set(got))
    assert set(got) == expected
    assert summary.input_rows == samples["n_rows"]
    assert summary.rejected_rows == len(expected) == samples["malformed_count"] + len(samples["over_long_ticket_ids"])
    assert summary.accepted_rows == samples["n_rows"] - summary.rejected_rows
    assert sum(summary.rejects_by_reason.values()) == summary.rejected_rows


def test_line_numbers_survive_block_boundaries(tmp_path, monkeypatch):
    """Tiny read chunks split the file into many blocks; line numbers and rejects stay the same."""
    lines = []
    for i in range(60):
        lines.append(good(i) if i % 7 else b'{"id": "bad%d", "body": ' % i)
        if i % 11 == 0:
            lines.append({"id": f"n{i}", "subject": "no body"})
    path = write_jsonl(tmp_path / "in.jsonl", lines)
    frame_big, rejects_big = read_all(path)
    monkeypatch.setattr(manifest_rows, "CHUNK_BYTES", 50)  # configuration, not behaviour: smaller blocks
    frame_small, rejects_small = read_all(path)
    assert frame_small.equals(frame_big)
    assert [(r.line, r.kind) for r in rejects_small] == [(r.line, r.kind) for r in rejects_big]
    assert len(rejects_big) == 9 + 6 and frame_big.height == len(lines) - 15


def test_csv_input_reports_row_numbers(tmp_path):
    path = tmp_path / "in.csv"
    path.write_text(
        'id,body,other\nc1,"first, with a comma",x\nc2,,y\nc3,"third ""quoted""",z\nc4,   ,w\nc5,fifth,v\n',
        encoding="utf-8",
    )
    spec = write_spec(tmp_path / "job", base_spec_dict(str(path)))
    store = Store(tmp_path / "store")
    summary = build_manifest(spec, store)
    m = Manifest("t", store)
    rejects = [(r["source"], r["line"], r["kind"], r["field"]) for r in m.rejects().to_pylist()]
    assert rejects == [(str(path), 3, "empty_text", "body"), (str(path), 5, "empty_text", "body")]
    rows = m.rows().to_pylist()
    assert [(r["line"], r["source_key"]) for r in rows] == [(2, "c1"), (4, "c3"), (6, "c5")]
    prompts = sorted(r["user_prompt"] for r in m.item_index(["user_prompt"]).to_pylist())
    assert prompts == ["Ticket:\nfifth", "Ticket:\nfirst, with a comma", 'Ticket:\nthird "quoted"']
    assert (summary.input_rows, summary.rejected_rows, summary.accepted_rows) == (5, 2, 3)


def test_csv_without_the_text_column_is_an_input_error(tmp_path):
    path = tmp_path / "in.csv"
    path.write_text("id,text\n1,hello\n")
    spec = write_spec(tmp_path / "job", base_spec_dict(str(path)))
    with pytest.raises(InputError, match=r"in\.csv.*body"):
        build_manifest(spec, Store(tmp_path / "store"))


def test_parquet_input_reports_row_numbers(tmp_path):
    path = tmp_path / "in.parquet"
    table = pa.table(
        {"id": ["p1", "p2", "p3", "p4", "p5"], "body": ["one", None, "three", "", "five"], "unused": [1, 2, 3, 4, 5]}
    )
    pq.write_table(table, path, row_group_size=2)
    spec = write_spec(tmp_path / "job", base_spec_dict(str(path)))
    store = Store(tmp_path / "store")
    summary = build_manifest(spec, store)
    m = Manifest("t", store)
    rejects = [(r["line"], r["kind"], r["field"]) for r in m.rejects().to_pylist()]
    assert sorted(rejects) == [(2, "missing_field", "body"), (4, "empty_text", "body")]
    assert [(r["line"], r["source_key"]) for r in m.rows().to_pylist()] == [(1, "p1"), (3, "p3"), (5, "p5")]
    assert (summary.input_rows, summary.rejected_rows, summary.accepted_rows) == (5, 2, 3)


def test_too_long_rows_are_rejected_by_token_estimate(tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", [good(1), {"id": "long", "body": "x" * 4000}, good(3)])
    spec = write_spec(
        tmp_path / "job",
        {
            **base_spec_dict(str(path)),
            "input": {"path": str(path), "text_field": "body", "key_field": "id", "max_input_tokens": 500},
        },
    )
    store = Store(tmp_path / "store")
    summary = build_manifest(spec, store)
    [reject] = Manifest("t", store).rejects().to_pylist()
    assert (reject["line"], reject["kind"]) == (2, "too_long")
    assert "500" in reject["reason"]
    assert summary.accepted_rows == 2
    tokens = Manifest("t", store).item_index(["est_input_tokens"]).column("est_input_tokens").to_pylist()
    assert all(0 < t <= 500 for t in tokens)


def test_resolve_inputs_is_sorted_and_skips_hidden_files(tmp_path):
    for name in ("b.jsonl", "a.jsonl", ".hidden.jsonl", "sub/c.jsonl"):
        write_jsonl(tmp_path / "d" / name, [good(1)])
    files = resolve_inputs(str(tmp_path / "d"))
    assert [f.uri for f in files] == [str(tmp_path / "d" / n) for n in ("a.jsonl", "b.jsonl", "sub/c.jsonl")]
    with pytest.raises(InputError, match="matches no files"):
        resolve_inputs(str(tmp_path / "nothing" / "*.jsonl"))
    (tmp_path / "d" / "x.txt").write_text("?")
    with pytest.raises(InputError, match="input.format"):
        resolve_inputs(str(tmp_path / "d" / "x.txt"))
