"""How many shards fill at once: at most 8, no more than the rows to come fill, and no more than ~128 MB of rows
of the input's mean size (the open shards' frames are the build's largest buffers)."""

from collections import Counter

import pytest

from batch_pipeline.core.manifest import deal
from batch_pipeline.core.manifest.deal import OPEN_SHARDS_BYTES, open_shard_window
from batch_pipeline_tests.core.manifest.test_sharding import build, check_partition, mixed_rows


@pytest.mark.parametrize(
    ("rows", "row_bytes", "max_requests", "window"),
    [
        (1_000_000, 950, 5_000, 8),  # small shards: all 8 (5,000 x 950 B is 4.75 MB)
        (1_000, 200, 300, 4),  # the rows to come fill 4
        (400_000, 950, 50_000, 2),  # 50,000 rows of ~1 KB: 47.5 MB a shard, two within 128 MB
        (400_000, 20_000, 50_000, 1),  # a shard alone is past the budget: still one open
        (0, 0, 50_000, 1),  # nothing to read
    ],
)
def test_the_window_is_bounded_by_rows_and_by_bytes(rows, row_bytes, max_requests, window):
    assert open_shard_window(rows, rows * row_bytes, max_requests) == window


def test_the_budget_is_what_the_open_shards_may_hold():
    shard = 50_000 * 1_000
    assert open_shard_window(400_000, 400_000 * 1_000, 50_000) == OPEN_SHARDS_BYTES // shard


def shard_sizes(tmp_path, monkeypatch, budget: int | None) -> list[int]:
    if budget is not None:
        monkeypatch.setattr(deal, "OPEN_SHARDS_BYTES", budget)
    summary, index = build(tmp_path, mixed_rows(1_000, 9), max_requests=100)
    check_partition(summary, index, 1_000)
    return sorted(Counter(index["shard_id"].to_list()).values(), reverse=True)


def test_eight_open_shards_fill_in_turn(tmp_path, monkeypatch):
    # 8 shards fill together (100 each), then 8 more share the last 200 rows
    assert shard_sizes(tmp_path, monkeypatch, None) == [100] * 8 + [25] * 8


def test_a_byte_budget_of_one_shard_fills_them_one_at_a_time(tmp_path, monkeypatch):
    assert shard_sizes(tmp_path, monkeypatch, 1) == [100] * 10
