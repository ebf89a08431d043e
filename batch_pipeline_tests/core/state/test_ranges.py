"""Packing the shards a plan moves into partition-range runs (``shard_ranges``)."""

import pytest

from batch_pipeline.core.state.ranges import ShardRange, shard_ranges

ORDER = [f"s{i:05d}" for i in range(1, 11)]


def test_contiguous_shards_are_one_range_per_span():
    ranges = shard_ranges(ORDER, ORDER, span=4)
    assert [(r.start, r.end, len(r.shards)) for r in ranges] == [
        ("s00001", "s00004", 4),
        ("s00005", "s00008", 4),
        ("s00009", "s00010", 2),
    ]


def test_a_range_may_step_over_shards_that_do_not_move_but_never_spans_more_than_span_partitions():
    moving = ["s00002", "s00004", "s00005", "s00009"]
    ranges = shard_ranges(ORDER, moving, span=4)
    assert ranges == [
        ShardRange("s00002", "s00005", ("s00002", "s00004", "s00005")),
        ShardRange("s00009", "s00009", ("s00009",)),
    ]
    for r in ranges:
        assert ORDER.index(r.end) - ORDER.index(r.start) < 4


def test_every_moving_shard_is_in_exactly_one_range_and_unknown_shards_in_none():
    moving = ORDER[::3] + ["s99999"]
    ranges = shard_ranges(ORDER, moving, span=2)
    packed = [s for r in ranges for s in r.shards]
    assert packed == ORDER[::3]
    assert all(r.single for r in ranges)  # every third shard: no two fit in a span of 2


def test_span_one_is_one_run_per_shard_and_span_zero_is_refused():
    assert [r.shards for r in shard_ranges(ORDER[:3], ORDER[:3], span=1)] == [("s00001",), ("s00002",), ("s00003",)]
    with pytest.raises(ValueError):
        shard_ranges(ORDER, ORDER, span=0)


def test_the_digest_changes_with_the_shards_and_with_what_they_do():
    r = ShardRange("s00001", "s00002", ("s00001", "s00002"))
    assert r.digest(["submit:s00001:1"]) == r.digest(["submit:s00001:1"])
    assert r.digest(["submit:s00001:1"]) != r.digest(["submit:s00001:2"])
    assert r.digest() != ShardRange("s00001", "s00002", ("s00001",)).digest()
