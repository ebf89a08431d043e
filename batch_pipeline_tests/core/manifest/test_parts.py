"""Files prepared on their own and merged give exactly the shards and rows of a one-process build; a part
prepared for another version of its file is not used."""

import pyarrow.parquet as pq

from batch_pipeline.core.manifest.parts import (
    FileParts,
    part_key,
    pending_files,
    prepare_file_part,
)
from batch_pipeline.core.manifest.shards import Manifest, build_manifest
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline_tests.core.helpers import base_spec_dict, write_jsonl, write_spec
from batch_pipeline_tests.core.manifest.test_dedup_spill import input_rows


def make_job(root):
    data = root / "in"
    write_jsonl(data / "a.jsonl", input_rows(1, 0, 900))
    write_jsonl(data / "b.jsonl", input_rows(2, 900, 700) + input_rows(1, 0, 50))
    write_jsonl(data / "c.jsonl", input_rows(3, 1600, 500) + [b"{broken", b'{"id": "x", "body": ""}'])
    spec = write_spec(root / "jobs", base_spec_dict(str(data / "*.jsonl"), shards={"max_requests": 150}))
    return spec, Store(root / "store"), data


def snapshot(store: Store) -> dict:
    m = Manifest("t", store)

    def named(r: dict) -> dict:
        return {**r, "source": r["source"].rsplit("/", 1)[1]}

    return {
        "shards": {
            s: [named(r) for r in pq.read_table(store.local_path(JobPaths("t").shard_items(s))).to_pylist()]
            for s in m.shard_ids()
        },
        "rows": sorted(tuple(named(r).values()) for r in m.rows().to_pylist()),
        "rejects": sorted((r["source"].rsplit("/", 1)[1], r["line"], r["kind"]) for r in m.rejects().to_pylist()),
    }


def merge_parts(spec, store):
    for plan in pending_files(spec, store):
        assert prepare_file_part(spec, store, part_key(plan.file.uri)) is not None
    parts = FileParts(spec, store)
    summary = build_manifest(spec, store, parts=parts)
    return summary, parts


def test_merged_parts_equal_a_one_process_build(tmp_path):
    spec, store, data = make_job(tmp_path / "one")
    direct = build_manifest(spec, store)
    write_jsonl(data / "a.jsonl", input_rows(4, 5000, 200), mode="ab")
    direct2 = build_manifest(spec, store)

    spec_p, store_p, data_p = make_job(tmp_path / "parts")
    merged, parts = merge_parts(spec_p, store_p)
    assert len(parts.used) == 3  # every file came from its part, none was read by the merge
    write_jsonl(data_p / "a.jsonl", input_rows(4, 5000, 200), mode="ab")
    merged2, parts2 = merge_parts(spec_p, store_p)
    assert [p.record.offset > 0 for p in parts2.used] == [True]  # only the appended part of a.jsonl
    assert snapshot(store_p) == snapshot(store)
    for a, b in ((direct, merged), (direct2, merged2)):
        assert (a.new_requests, a.new_shards, a.input_rows, a.rejected_rows, a.known_requests) == (
            b.new_requests,
            b.new_shards,
            b.input_rows,
            b.rejected_rows,
            b.known_requests,
        )
    assert merged.rejected_rows == 2


def test_a_part_for_another_version_of_its_file_is_not_used(tmp_path):
    spec, store, data = make_job(tmp_path)
    key = part_key(str(data / "b.jsonl"))
    assert prepare_file_part(spec, store, key) is not None
    write_jsonl(data / "b.jsonl", input_rows(5, 7000, 30))  # rewritten after its part was prepared
    parts = FileParts(spec, store)
    summary = build_manifest(spec, store, parts=parts)
    assert parts.used == []
    assert sorted(
        r["source_key"] for r in Manifest("t", store).rows().to_pylist() if r["source"].endswith("b.jsonl")
    ) == sorted(f"k{i}" for i in range(7000, 7030))
    assert summary.input_rows == 900 + 30 + 502


def test_a_file_with_nothing_to_read_has_no_part(tmp_path):
    spec, store, data = make_job(tmp_path)
    build_manifest(spec, store)
    assert pending_files(spec, store) == []
    assert prepare_file_part(spec, store, part_key(str(data / "a.jsonl"))) is None
