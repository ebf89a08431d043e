"""Compressed input files (``.jsonl.gz``, ``.jsonl.zst``, ``.csv.gz``): read as the plain file would be, the same
items, rows and rejects by line; a torn archive is named; a changed archive is read again, never appended."""

import gzip
import json
import os

import pyarrow as pa
import pytest

from batch_pipeline.core.errors import InputError
from batch_pipeline.core.manifest.inputs import resolve_inputs
from batch_pipeline.core.manifest.shards import Manifest, build_manifest
from batch_pipeline.core.store import Store
from batch_pipeline_tests.core.helpers import base_spec_dict, write_jsonl, write_spec

BAD_LINES = {7: b'{"id": "cut", "body": "no end', 40: json.dumps({"id": "e", "body": " \t "}).encode()}


def lines(n: int) -> list:
    """``n`` rows with a broken line and an empty body among them, and a duplicate of row 3."""
    out: list = []
    for i in range(1, n + 1):
        if i in BAD_LINES:
            out.append(BAD_LINES[i])
        elif i == 60:
            out.append({"id": "dup", "body": "ticket 3: " + "word " * 3})
        else:
            out.append({"id": f"k{i}", "body": f"ticket {i}: " + "word " * (i % 9)})
    return out


def compress(plain, codec: str):
    target = plain.with_name(plain.name + {"gzip": ".gz", "zstd": ".zst", "bz2": ".bz2"}[codec])
    with pa.CompressedOutputStream(str(target), codec) as out:
        out.write(plain.read_bytes())
    plain.unlink()
    return target


def build(tmp_path, name: str, path: str, template: str | None = None, **input_overrides):
    spec_dict = base_spec_dict(path, shards={"max_requests": 25})
    spec_dict["input"].update(input_overrides)
    if template is not None:
        spec_dict["prompt"]["template"] = template
    spec = write_spec(tmp_path / f"jobs-{name}", spec_dict)
    store = Store(tmp_path / f"store-{name}")
    return spec, store, build_manifest(spec, store)


def manifest_view(store: Store) -> tuple:
    m = Manifest("t", store)
    rows = sorted((r["request_id"], r["line"], r["source_key"]) for r in m.rows().to_pylist())
    rejects = sorted((r["line"], r["kind"], r["field"]) for r in m.rejects().to_pylist())
    items = sorted(m.item_index(["request_id"]).column("request_id").to_pylist())
    return rows, rejects, items


@pytest.mark.parametrize("codec", ["gzip", "zstd", "bz2"])
def test_a_compressed_jsonl_gives_the_plain_files_items_rows_and_rejects(tmp_path, codec):
    plain = write_jsonl(tmp_path / "plain" / "in.jsonl", lines(150))
    _, plain_store, plain_summary = build(tmp_path, "plain", str(plain))
    packed = write_jsonl(tmp_path / "packed" / "in.jsonl", lines(150))
    packed = compress(packed, codec)
    files = resolve_inputs(str(tmp_path / "packed" / "*"))
    assert [(f.format, f.compression) for f in files] == [("jsonl", codec)]
    _, store, summary = build(tmp_path, "packed", str(packed))
    assert (
        (summary.input_rows, summary.rejected_rows, summary.unique_requests)
        == (
            plain_summary.input_rows,
            plain_summary.rejected_rows,
            plain_summary.unique_requests,
        )
        == (150, 2, 147)
    )
    assert manifest_view(store) == manifest_view(plain_store)
    rejects = Manifest("t", store).rejects().to_pylist()
    assert {(r["line"], r["kind"]) for r in rejects} == {(7, "bad_json"), (40, "empty_text")}
    assert all(r["source"] == str(packed) for r in rejects)


def test_a_gzipped_csv_is_read_by_its_name(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    body = "id,body\n" + "".join(f"c{i},ticket {i} about a refund\n" for i in range(30))
    (folder / "rows.csv.gz").write_bytes(gzip.compress(body.encode()))
    _, store, summary = build(tmp_path, "csv", str(folder / "rows.csv.gz"))
    assert summary.input_rows == summary.unique_requests == 30
    assert sorted(r["line"] for r in Manifest("t", store).rows().to_pylist()) == list(range(2, 32))


def test_a_torn_archive_names_the_file_and_the_last_good_line(tmp_path):
    packed = compress(write_jsonl(tmp_path / "in" / "big.jsonl", lines(20_000)), "zstd")
    data = packed.read_bytes()
    packed.write_bytes(data[: len(data) // 2])  # a copy cut off half way
    with pytest.raises(InputError) as caught:
        build(tmp_path, "torn", str(packed))
    message = str(caught.value)
    assert str(packed) in message and "cannot decompress (zstd)" in message and "copy it again" in message


def test_an_outer_compression_on_parquet_is_refused_with_the_fix(tmp_path):
    (tmp_path / "rows.parquet.gz").write_bytes(gzip.compress(b"PAR1"))
    with pytest.raises(InputError, match=r"rows\.parquet\.gz: a Parquet file is compressed inside"):
        resolve_inputs(str(tmp_path / "rows.parquet.gz"))


def test_a_changed_archive_is_read_again_from_its_start_and_an_unchanged_one_skipped(tmp_path):
    folder = tmp_path / "in"
    packed = compress(write_jsonl(folder / "in.jsonl", lines(100)), "gzip")
    spec, store, first = build(tmp_path, "grow", str(packed))
    assert first.unique_requests == 97
    again = build_manifest(spec, store)
    assert again.files["skipped"] == [str(packed)] and again.input_rows == 0
    # the archive rewritten with 20 more lines: the first 100 are read again (known), not appended from an offset
    grown = write_jsonl(folder / "in.jsonl", lines(120))
    assert compress(grown, "gzip") == packed
    os.utime(packed, ns=(0, os.stat(packed).st_mtime_ns + 10**9))
    second = build_manifest(spec, store)
    assert second.files["reread"] == [str(packed)]
    assert second.input_rows == 120 and second.new_requests == 20 and second.known_requests == 97
    rows, rejects, items = manifest_view(store)
    assert len(items) == 117 and max(line for _, line, _ in rows) == 120


def test_compressed_files_prepared_as_parts_merge_to_the_one_process_build(tmp_path):
    from batch_pipeline.core.manifest.parts import FileParts, part_key, pending_files, prepare_file_part

    def job(root):
        folder = root / "in"
        compress(write_jsonl(folder / "a.jsonl", lines(120)), "zstd")
        compress(write_jsonl(folder / "b.jsonl", lines(90)[30:]), "gzip")
        spec = write_spec(root / "jobs", base_spec_dict(str(folder / "*.jsonl.*"), shards={"max_requests": 25}))
        return spec, Store(root / "store")

    spec, store = job(tmp_path / "one")
    direct = build_manifest(spec, store)
    spec_p, store_p = job(tmp_path / "parts")
    for plan in pending_files(spec_p, store_p):
        assert prepare_file_part(spec_p, store_p, part_key(plan.file.uri)) is not None
    parts = FileParts(spec_p, store_p)
    merged = build_manifest(spec_p, store_p, parts=parts)
    assert len(parts.used) == 2 and merged.unique_requests == direct.unique_requests
    assert manifest_view(store_p) == manifest_view(store)


@pytest.mark.parametrize("name", ["rows.csv.gz", "batch.jsonl.zst"])
def test_a_torn_csv_or_batch_archive_is_named_too(tmp_path, name):
    folder = tmp_path / "in"
    folder.mkdir()
    if name.startswith("rows"):
        text = "id,body\n" + "".join(f"c{i},ticket {i} about a refund {i * 7919}\n" for i in range(40_000))
        extra: dict = {}
    else:
        line = {"method": "POST", "url": "/v1/chat/completions", "body": {"model": "m-1", "messages": []}}
        text = "".join(json.dumps({**line, "custom_id": f"r{i}"}) + "\n" for i in range(40_000))
        extra = {"format": "openai_batch", "key_field": "custom_id", "text_field": "user", "template": "{user}"}
    codec = "gzip" if name.endswith(".gz") else "zstd"
    with pa.CompressedOutputStream(str(folder / name), codec) as out:
        out.write(text.encode())
    data = (folder / name).read_bytes()
    (folder / name).write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=rf"{name}: cannot decompress \({codec}\).*copy it again"):
        build(tmp_path, "torn", str(folder / name), **extra)
