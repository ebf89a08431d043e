"""Incremental builds by input file: an unchanged file is skipped, a grown JSONL is read from its old end, a
rewritten file is read again; existing shards never change and the rows table answers every current row."""

import json
import os

import pytest

from batch_pipeline.core.manifest.incremental import FileAction
from batch_pipeline.core.manifest.shards import Manifest, build_manifest
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline_tests.core.helpers import (
    base_spec_dict,
    reference_request_id,
    write_jsonl,
    write_spec,
)


def rows(start: int, n: int, tag: str = "") -> list[dict]:
    return [{"id": f"k{i:05d}", "body": f"ticket {i}{tag}: " + "word " * (i % 40)} for i in range(start, start + n)]


def shard_bytes(store: Store, m: Manifest) -> dict[str, bytes]:
    return {s: store.read_bytes(JobPaths("t").shard_items(s)) for s in m.shard_ids()}


def names(uris: list[str]) -> list[str]:
    return sorted(u.rsplit("/", 1)[1] for u in uris)


@pytest.fixture
def job(tmp_path):
    a = write_jsonl(tmp_path / "in" / "a.jsonl", rows(0, 120))
    b = write_jsonl(tmp_path / "in" / "b.jsonl", rows(1000, 80))
    spec = write_spec(tmp_path / "jobs", base_spec_dict(str(tmp_path / "in" / "*.jsonl"), shards={"max_requests": 50}))
    store = Store(tmp_path / "store")
    first = build_manifest(spec, store)
    return {
        "spec": spec,
        "store": store,
        "m": Manifest("t", store),
        "a": a,
        "b": b,
        "first": first,
        "dir": tmp_path / "in",
    }


def check_rows_answer(job, expected_rows: list[dict]) -> None:
    """The live rows are exactly the current input's rows, each with its reference ID, and each ID an item."""
    live = job["m"].rows().to_pylist()
    assert sorted(r["source_key"] for r in live) == sorted(r["id"] for r in expected_rows)
    by_key = {r["source_key"]: r["request_id"] for r in live}
    for r in expected_rows:
        assert by_key[r["id"]] == reference_request_id(job["spec"], r)
    items = set(job["m"].item_index(["request_id"]).column("request_id").to_pylist())
    assert set(by_key.values()) <= items


def test_unchanged_files_are_skipped_and_nothing_is_read(job):
    before = shard_bytes(job["store"], job["m"])
    second = build_manifest(job["spec"], job["store"])
    assert names(second.files[FileAction.SKIPPED.value]) == ["a.jsonl", "b.jsonl"]
    assert second.input_rows == second.new_requests == 0 and second.new_shards == []
    assert second.unique_requests == 200 == job["first"].unique_requests
    assert shard_bytes(job["store"], job["m"]) == before
    check_rows_answer(job, rows(0, 120) + rows(1000, 80))
    record = job["m"].latest()
    assert {f.action.value for f in record.files} == {"skipped"}


def test_an_appended_file_is_read_from_its_old_end(job):
    write_jsonl(job["a"], rows(120, 30) + rows(0, 5, tag=""), mode="ab")  # 30 new rows, 5 repeats of old ones
    before = shard_bytes(job["store"], job["m"])
    second = build_manifest(job["spec"], job["store"])
    assert names(second.files["appended"]) == ["a.jsonl"] and names(second.files["skipped"]) == ["b.jsonl"]
    assert second.input_rows == 35  # only the appended lines were read
    assert second.new_requests == 30 and second.known_requests == 5 and second.duplicates_collapsed == 5
    after = shard_bytes(job["store"], job["m"])
    assert all(after[s] == data for s, data in before.items())
    check_rows_answer(job, rows(0, 150) + rows(0, 5) + rows(1000, 80))
    # appended rows keep their line numbers in the file
    lines = {(r["source_key"], r["line"]) for r in job["m"].rows().to_pylist() if r["source"].endswith("a.jsonl")}
    assert ("k00120", 121) in lines and ("k00149", 150) in lines and ("k00004", 155) in lines
    # a further append is read from the new end; the file's live rows span both generations
    write_jsonl(job["a"], rows(150, 10), mode="ab")
    third = build_manifest(job["spec"], job["store"])
    assert third.input_rows == 10 and third.new_requests == 10
    state = {f.uri.rsplit("/", 1)[1]: f for f in job["m"].latest().files}
    assert state["a.jsonl"].row_generations == [1, 2, 3] and state["b.jsonl"].row_generations == [1]
    check_rows_answer(job, rows(0, 160) + rows(0, 5) + rows(1000, 80))


def test_a_rewritten_file_is_read_again_and_its_changed_rows_handled(job):
    before = shard_bytes(job["store"], job["m"])
    old_ids = set(job["m"].item_index(["request_id"]).column("request_id").to_pylist())
    # same rows except ten changed bodies and ten dropped; new rows in front, so it is no append
    new_b = rows(2000, 5) + [
        r if i % 7 else {**r, "body": r["body"] + " (edited)"} for i, r in enumerate(rows(1000, 70))
    ]
    write_jsonl(job["b"], new_b)
    second = build_manifest(job["spec"], job["store"])
    assert names(second.files["reread"]) == ["b.jsonl"] and names(second.files["skipped"]) == ["a.jsonl"]
    assert second.input_rows == 75
    changed = {reference_request_id(job["spec"], r) for r in new_b} - old_ids
    assert second.new_requests == len(changed) == 5 + 10
    assert second.known_requests == 75 - 15
    after = shard_bytes(job["store"], job["m"])
    assert all(after[s] == data for s, data in before.items())  # existing shards keep their exact membership
    new_items = {
        r for s in second.new_shards for r in job["m"].shard_items(s, ["request_id"]).column("request_id").to_pylist()
    }
    assert new_items == changed
    check_rows_answer(job, rows(0, 120) + new_b)  # the old version's rows are gone from the rows table


def test_a_grown_file_whose_old_part_changed_is_a_rewrite(job):
    data = job["a"].read_bytes()
    job["a"].write_bytes(data.replace(b"ticket 3:", b"ticket 3!") + json.dumps(rows(500, 1)[0]).encode() + b"\n")
    second = build_manifest(job["spec"], job["store"])
    assert names(second.files["reread"]) == ["a.jsonl"]
    assert second.input_rows == 121 and second.new_requests == 2


def test_a_touched_file_with_the_same_bytes_is_read_again_and_adds_nothing(job):
    st = job["a"].stat()
    os.utime(job["a"], ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    second = build_manifest(job["spec"], job["store"])
    assert names(second.files["reread"]) == ["a.jsonl"]
    assert second.new_requests == 0 and second.known_requests == 120 and second.new_shards == []
    check_rows_answer(job, rows(0, 120) + rows(1000, 80))


def test_a_removed_file_leaves_the_rows_table_and_its_items_stay(job):
    job["b"].unlink()
    second = build_manifest(job["spec"], job["store"])
    assert names(second.files["skipped"]) == ["a.jsonl"] and second.input_files == 1
    check_rows_answer(job, rows(0, 120))
    assert len(job["m"].item_index(["request_id"])) == 200  # items are never removed from shards


def test_a_job_built_before_the_index_gets_it_from_its_shards(job):
    """Generations committed before the on-disk ID index: the next build writes their index from the shards."""
    paths = JobPaths("t")
    job["store"].delete(paths.id_index(1))
    write_jsonl(job["dir"] / "c.jsonl", rows(0, 10) + rows(3000, 10))
    second = build_manifest(job["spec"], job["store"])
    assert job["store"].exists(paths.id_index(1))
    assert second.new_requests == 10 and second.known_requests == 10
