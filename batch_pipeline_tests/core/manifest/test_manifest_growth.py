"""Growing an input never moves an existing item: old shard files stay byte-identical, only new items
go into new shards, duplicates of old rows create nothing, and the rows table answers every source row."""

import random

import pyarrow.parquet as pq
import pytest

from batch_pipeline.core.manifest.shards import Manifest, build_manifest
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline_tests.core.helpers import base_spec_dict, reference_request_id, write_jsonl, write_spec

LENGTHS = (10, 40, 200, 700, 2500)


def make_rows(rng: random.Random, start: int, n: int) -> list[dict]:
    return [
        {"id": f"k{i:05d}", "body": f"row {i}: " + " ".join(["word"] * (rng.choice(LENGTHS) // 5))}
        for i in range(start, start + n)
    ]


def whitespace_twin(body: str, rng: random.Random) -> str:
    return (
        rng.choice(("  ", "\t", "\n", " \xa0", "\u2028 ")) + body.replace(" ", rng.choice(("  ", "\t", " \xa0"))) + "\n"
    )


def shard_files(store: Store, manifest: Manifest) -> dict[str, bytes]:
    return {sid: store.read_bytes(JobPaths("t").shard_items(sid)) for sid in manifest.shard_ids()}


@pytest.fixture
def grown(tmp_path):
    rng = random.Random(99)
    data = tmp_path / "in" / "part1.jsonl"
    old_rows = make_rows(rng, 0, 200)
    write_jsonl(data, old_rows)
    spec = write_spec(tmp_path / "jobs", base_spec_dict(str(tmp_path / "in" / "*.jsonl"), shards={"max_requests": 60}))
    store = Store(tmp_path / "store")
    manifest = Manifest("t", store)

    first = build_manifest(spec, store)
    before_files = shard_files(store, manifest)
    before_index = {
        r["request_id"]: r
        for r in manifest.item_index(["request_id", "shard_id", "source", "line", "generation"]).to_pylist()
    }

    # grow: new rows appended to the old file and in a new file, plus duplicates of old rows (exact and
    # whitespace variants) under new keys
    new_rows = make_rows(rng, 1000, 60)
    more_rows = make_rows(rng, 2000, 40)
    dups = [
        {"id": f"dup{i}", "body": (r["body"] if i % 2 else whitespace_twin(r["body"], rng))}
        for i, r in enumerate(rng.sample(old_rows, 20))
    ]
    dup_of = {d["id"]: old_rows[[r["body"] for r in old_rows].index(" ".join(d["body"].split()))]["id"] for d in dups}
    write_jsonl(data, new_rows + dups[:10], mode="ab")
    write_jsonl(tmp_path / "in" / "part2.jsonl", dups[10:] + more_rows)
    second = build_manifest(spec, store)
    return dict(
        spec=spec,
        store=store,
        manifest=manifest,
        first=first,
        second=second,
        before_files=before_files,
        before_index=before_index,
        old_rows=old_rows,
        new_rows=new_rows + more_rows,
        dups=dups,
        dup_of=dup_of,
    )


def test_old_shards_are_untouched_and_old_items_stay_put(grown):
    m, store = grown["manifest"], grown["store"]
    assert len(grown["before_files"]) >= 2
    after_files = shard_files(store, m)
    for sid, data in grown["before_files"].items():
        assert after_files[sid] == data, f"shard {sid} was rewritten"
    after_index = {
        r["request_id"]: r for r in m.item_index(["request_id", "shard_id", "source", "line", "generation"]).to_pylist()
    }
    for rid, row in grown["before_index"].items():
        assert after_index[rid] == row  # same shard, same source row, same generation
    assert all(r["generation"] == 1 for r in grown["before_index"].values())


def test_only_new_items_go_into_new_shards(grown):
    m, first, second, spec = grown["manifest"], grown["first"], grown["second"], grown["spec"]
    assert second.generation == 2
    assert not set(second.new_shards) & set(first.new_shards)
    assert min(second.new_shards) > max(first.new_shards)
    assert m.shard_ids() == sorted(first.new_shards + second.new_shards)
    assert second.shards_total == len(first.new_shards) + len(second.new_shards)

    new_items = []
    for sid in second.new_shards:
        t = m.shard_items(sid).to_pylist()
        assert {r["generation"] for r in t} == {2} and {r["shard_id"] for r in t} == {sid}
        new_items.extend(t)
    expected_new = {reference_request_id(spec, r) for r in grown["new_rows"]}
    assert {r["request_id"] for r in new_items} == expected_new
    assert len(new_items) == len(expected_new) == second.new_requests == 100

    # every ID is in exactly one shard
    index = m.item_index(["request_id"]).column("request_id").to_pylist()
    assert len(index) == len(set(index)) == 300 == second.unique_requests


def test_duplicates_of_old_rows_create_no_items_and_rows_table_answers_every_row(grown):
    m, second, spec = grown["manifest"], grown["second"], grown["spec"]
    rows = m.rows().to_pylist()
    assert len(rows) == 200 + 100 + 20
    # the second generation read only what was new: part1 from its old end, part2 whole
    assert second.accepted_rows == second.input_rows == 60 + 10 + 10 + 40
    assert [u.rsplit("/", 1)[1] for u in second.files["appended"]] == ["part1.jsonl"]
    assert [u.rsplit("/", 1)[1] for u in second.files["read"]] == ["part2.jsonl"]
    by_key = {r["source_key"]: r["request_id"] for r in rows}
    for r in grown["old_rows"] + grown["new_rows"]:
        assert by_key[r["id"]] == reference_request_id(spec, r)
    for dup_key, original_key in grown["dup_of"].items():
        assert by_key[dup_key] == by_key[original_key]
    assert second.duplicates_collapsed == 20
    items = set(m.item_index(["request_id"]).column("request_id").to_pylist())
    assert set(by_key.values()) == items  # every row resolves to an item, and every item has a row


def test_rebuilding_unchanged_input_adds_nothing(grown):
    m, store = grown["manifest"], grown["store"]
    before = shard_files(store, m)
    third = build_manifest(grown["spec"], store)
    assert (third.generation, third.new_requests, third.new_shards) == (3, 0, [])
    assert third.unique_requests == 300 and third.shards_total == len(before)
    assert shard_files(store, m) == before
    # the generation record is the commit: every generation is listed
    assert [g.generation for g in sorted(m.generations(), key=lambda g: g.generation)] == [1, 2, 3]


def test_shard_items_files_are_sorted_and_self_describing(grown):
    m, store = grown["manifest"], grown["store"]
    for sid in m.shard_ids():
        table = pq.read_table(store.local_path(JobPaths("t").shard_items(sid)))
        rids = table.column("request_id").to_pylist()
        assert rids == sorted(rids)
        assert set(table.column("shard_id").to_pylist()) == {sid}
        prompts = table.column("user_prompt").to_pylist()
        assert table.column("request_bytes").to_pylist() == [len(p.encode()) for p in prompts]
