"""Shards respect ``shards.max_requests`` and ``shards.max_bytes``, partition the items exactly, and are a
representative mix of length buckets."""

import random
from collections import Counter

import polars as pl
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batch_pipeline.core.manifest.shards import BUCKET_EDGES, ITEM_SCHEMA, Manifest, build_manifest
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline_tests.core.helpers import base_spec_dict, write_jsonl, write_spec

# body lengths that land in different length buckets (tokens ~ bytes / 4)
LENGTHS = (20, 120, 400, 1500, 5000)


def mixed_rows(n: int, seed: int, lengths=LENGTHS) -> list[dict]:
    rng = random.Random(seed)
    return [{"id": f"k{i}", "body": f"{i} " + "w" * rng.choice(lengths)} for i in range(n)]


def build(tmp_path, rows, **shards):
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    spec = write_spec(tmp_path / "job", base_spec_dict(str(path), shards=shards))
    store = Store(tmp_path / "store")
    summary = build_manifest(spec, store)
    index = pl.from_arrow(
        Manifest("t", store).item_index(
            ["request_id", "shard_id", "length_bucket", "request_bytes", "est_input_tokens"]
        )
    )
    return summary, index


def check_partition(summary, index, n_unique):
    assert index.height == n_unique == summary.unique_requests
    assert index["request_id"].n_unique() == n_unique  # no item in two shards
    assert sorted(index["shard_id"].unique().to_list()) == sorted(summary.new_shards)


def histogram(frame: pl.DataFrame) -> dict[int, float]:
    counts = Counter(frame["length_bucket"].to_list())
    total = sum(counts.values())
    return {b: counts.get(b, 0) / total for b in range(len(BUCKET_EDGES) + 1)}


def assert_representative(index: pl.DataFrame, tolerance: float, min_size: int):
    overall = histogram(index)
    assert sum(1 for p in overall.values() if p > 0.1) >= 3, "the input must mix lengths for this test to mean anything"
    checked = 0
    for (sid,), shard in index.group_by("shard_id"):
        if shard.height < min_size:
            continue
        checked += 1
        h = histogram(shard)
        worst = max(abs(h[b] - overall[b]) for b in overall)
        assert worst <= tolerance, f"shard {sid} ({shard.height} items) deviates by {worst:.3f}: {h} vs {overall}"
    assert checked >= 2


def test_buckets_follow_token_estimates(tmp_path):
    summary, index = build(tmp_path, mixed_rows(200, 1))
    edges = [0, *BUCKET_EDGES, 10**9]
    for tokens, bucket in index.select("est_input_tokens", "length_bucket").iter_rows():
        assert edges[bucket] < tokens <= edges[bucket + 1] or (bucket == 0 and tokens <= edges[1])


def test_shards_are_a_representative_mix_when_they_do_not_fill(tmp_path):
    rows = mixed_rows(2000, 2)
    summary, index = build(tmp_path, rows, max_requests=300)
    check_partition(summary, index, 2000)
    assert len(summary.new_shards) >= 5
    assert index.group_by("shard_id").len()["len"].max() <= 300
    assert_representative(index, tolerance=0.05, min_size=100)


def test_shards_are_a_representative_mix_even_for_length_sorted_input(tmp_path):
    rows = sorted(mixed_rows(2000, 3), key=lambda r: len(r["body"]))
    summary, index = build(tmp_path, rows, max_requests=300)
    check_partition(summary, index, 2000)
    assert_representative(index, tolerance=0.05, min_size=100)


def test_max_requests_is_respected_when_shards_fill(tmp_path):
    """More items than the window of open shards can hold: shards fill, close and are replaced."""
    rows = mixed_rows(1500, 4)
    summary, index = build(tmp_path, rows, max_requests=50)
    check_partition(summary, index, 1500)
    sizes = index.group_by("shard_id").len()["len"].to_list()
    assert max(sizes) <= 50
    assert len(sizes) >= 30


def test_shards_that_fill_are_still_a_representative_mix(tmp_path):
    rows = mixed_rows(3000, 5)
    summary, index = build(tmp_path, rows, max_requests=120)
    check_partition(summary, index, 3000)
    assert_representative(index, tolerance=0.12, min_size=100)


def test_max_bytes_is_respected(tmp_path):
    rows = mixed_rows(600, 6)
    max_bytes = 40_000
    summary, index = build(tmp_path, rows, max_requests=5000, max_bytes=max_bytes)
    check_partition(summary, index, 600)
    # every request line of a batch file repeats the system prompt: a lower bound of the shard's real size
    system_bytes = len(base_spec_dict("x")["prompt"]["system"].encode())
    per_shard = index.group_by("shard_id").agg((pl.col("request_bytes") + system_bytes).sum().alias("b"))["b"]
    assert per_shard.max() <= max_bytes
    assert per_shard.sum() > 10 * max_bytes


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 400), max_requests=st.integers(1, 120), seed=st.integers(0, 10**6))
def test_sharding_partitions_items_within_limits(tmp_path_factory, n, max_requests, seed):
    """Property: for any input size and limit, shards hold every unique item once and none exceeds the limit."""
    rows = mixed_rows(n, seed)
    rows += [dict(r, id=r["id"] + "-dup") for r in rows[: n // 5]]  # duplicates never become items
    summary, index = build(tmp_path_factory.mktemp("prop"), rows, max_requests=max_requests)
    check_partition(summary, index, n)
    assert index.group_by("shard_id").len()["len"].max() <= max_requests
    assert summary.duplicates_collapsed == n // 5


@pytest.mark.parametrize("max_requests", [7, 1])
def test_tiny_limits(tmp_path, max_requests):
    rows = mixed_rows(40, 8)
    summary, index = build(tmp_path, rows, max_requests=max_requests)
    check_partition(summary, index, 40)
    assert index.group_by("shard_id").len()["len"].max() <= max_requests


def test_a_shard_file_reads_back_as_the_item_schema(tmp_path):
    # shard files store no Arrow schema: the types a reader gets come from the Parquet types alone, and must be
    # ITEM_SCHEMA's (string, not large_string), or shards of different builds would not concatenate
    summary, _ = build(tmp_path, mixed_rows(300, seed=3), max_requests=100)
    store = Store(tmp_path / "store")
    for sid in summary.new_shards:
        path = store.local_path(JobPaths("t").shard_items(sid))
        assert pq.read_schema(path).remove_metadata() == ITEM_SCHEMA
        assert Manifest("t", store).shard_items(sid).schema.remove_metadata() == ITEM_SCHEMA
        assert pl.read_parquet(path).schema["user_prompt"] == pl.String
