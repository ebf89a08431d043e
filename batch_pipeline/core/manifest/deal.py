"""Dealing new items to shards: a small window of open shards, filled round-robin in a stratified order.

The window is 8 shards, or fewer when the rows to come fill fewer or when 8 full shards would hold more than
``OPEN_SHARDS_BYTES`` (big shards of long rows: 2 at 50,000 rows of ~1 KB). Each shard then spans 8 (or 2) times
its size of the input.

Within each block the new items are ordered so that every length bucket is spread evenly over the sequence,
then dealt to the open shards in turn: whenever a shard fills it holds every bucket in proportion, and the
open shards fill evenly. A shard is written once, as one Parquet file, when it fills; its membership never
changes. The assignment depends only on the blocks and their keep masks, in order, so a block dealt late
(replayed from a spill) lands exactly where it would have landed at once.
"""

import math
from collections.abc import Callable

import numpy as np
import polars as pl
import pyarrow as pa

from batch_pipeline.core.manifest.read import ITEM_SCHEMA
from batch_pipeline.core.manifest.rows import LINE
from batch_pipeline.core.store import BackgroundWrites, Store

OPEN_SHARD_WINDOW = 8
# What the open shards' frames may hold, by the input's bytes per row: they are the build's largest buffers. At
# shards of 50,000 ~1 KB rows, 8 open shards held ~400 MB: a 1M-row build peaked at 1.42 GB and spent 16.5 CPU s,
# against 1.0 GB and 14.9 with 2 open (benchmarks/README.md). Shards of 5,000 keep all 8.
OPEN_SHARDS_BYTES = 128 * 2**20
# dictionaries only where values repeat: on the unique prompts and IDs they cost 30% of the write and save nothing.
# No Arrow schema is stored: a reader gets ITEM_SCHEMA from the Parquet types alone (strings as ``string``), so the
# strings go out as Polars hands them over (``large_string``), without the copy a cast to ``string`` makes.
SHARD_PARQUET = {
    "use_dictionary": ["shard_id", "source"],
    "compression": "zstd",
    "compression_level": 1,
    "store_schema": False,
}
WRITE_SCHEMA = pa.schema([pa.field(f.name, pa.large_string()) if f.type == pa.string() else f for f in ITEM_SCHEMA])


def open_shard_window(rows_ahead: int, bytes_ahead: int, max_requests: int) -> int:
    """How many shards fill at once: ``OPEN_SHARD_WINDOW``, or fewer when the rows to come fill fewer, or when that
    many full shards of rows of the input's mean size (``bytes_ahead / rows_ahead``, the head read to count them)
    would hold more than ``OPEN_SHARDS_BYTES``. Never below one; the same input head gives the same window."""
    rows = max(rows_ahead, 1)
    by_rows = math.ceil(rows / max_requests)
    shard_bytes = max_requests * bytes_ahead / rows
    by_bytes = int(OPEN_SHARDS_BYTES // shard_bytes) if shard_bytes > 0 else OPEN_SHARD_WINDOW
    return max(1, min(OPEN_SHARD_WINDOW, by_rows, by_bytes))


def shard_name(number: int) -> str:
    return f"s{number:05d}"


class _OpenShard:
    __slots__ = ("bytes", "count", "frames", "number")

    def __init__(self, number: int):
        self.number, self.count, self.bytes, self.frames = number, 0, 0, []


class Dealer:
    """The open-shard window of one generation; ``deal`` one block at a time, ``close`` at the end."""

    def __init__(
        self,
        store: Store,
        shard_path: Callable[[str], str],
        gen: int,
        first_shard: int,
        window: int,
        max_requests: int,
        max_bytes: int,
        line_overhead: int,
        writes: BackgroundWrites,
    ):
        self.store, self.shard_path, self.gen = store, shard_path, gen
        self.window, self.max_requests, self.max_bytes = window, max_requests, max_bytes
        self.line_overhead, self.writes = line_overhead, writes
        self.open = [_OpenShard(first_shard + i) for i in range(window)]
        self.next_shard = first_shard + window
        self.turn = 0
        self.new_shards: list[str] = []
        self.written: dict[str, int] = {}  # shard -> items written
        self.written_est: dict[str, int] = {}  # shard -> the sum of its items' est_input_tokens
        self.dealt = 0
        self.est_tokens = 0

    def deal(self, frame: pl.DataFrame, keep: np.ndarray) -> None:
        """Deal the rows of ``frame`` (a prepared block with ``source``) that ``keep`` marks."""
        if not keep.any():
            return
        window, max_requests, max_bytes, overhead = self.window, self.max_requests, self.max_bytes, self.line_overhead
        order = _stratified_order(frame, keep)
        sizes = frame.get_column("request_bytes").to_numpy().astype(np.int64)[order] + overhead
        assign = np.zeros(frame.height, dtype=np.int64)
        full: list[_OpenShard] = []
        open_shards = self.open
        # row k of the order goes to slot (turn + k) % window; each slot fills its shard until the next row
        # would pass a cap, then a new shard takes the slot (the same as dealing the rows one by one)
        slots = (self.turn + np.arange(len(order))) % window
        for slot in range(window):
            mine = np.flatnonzero(slots == slot)
            at = 0
            while at < len(mine):
                shard = open_shards[slot]
                room = max_requests - shard.count
                fits = np.flatnonzero(shard.bytes + np.cumsum(sizes[mine[at : at + max(room, 0)]]) > max_bytes)
                take = min(room, len(mine) - at, int(fits[0]) if len(fits) else room)
                if take <= 0:
                    full.append(shard)  # closed once this block's rows are in it
                    open_shards[slot] = _OpenShard(self.next_shard)
                    self.next_shard += 1
                    shard = open_shards[slot]
                    take = 1  # a fresh shard always takes the next row
                rows = mine[at : at + take]
                shard.count += take
                shard.bytes += int(sizes[rows].sum())
                assign[order[rows]] = shard.number
                at += take
        self.turn += len(order)
        new = frame.filter(pl.Series(keep)).with_columns(pl.Series("_shard", assign[keep]))
        by_number = {s.number: s for s in [*open_shards, *full]}
        for (number,), part in new.partition_by("_shard", as_dict=True).items():
            by_number[number].frames.append(part)
        for shard in full:
            self._close(shard)
        self.dealt += new.height
        self.est_tokens += int(new.get_column("est_input_tokens").sum() or 0)

    def close(self) -> None:
        for shard in self.open:
            self._close(shard)
        self.open = []

    def _close(self, shard: _OpenShard) -> None:
        if shard.count == 0:
            return
        sid = shard_name(shard.number)
        frames, shard.frames = shard.frames, []
        self.new_shards.append(sid)
        self.writes.submit(self._write_shard, sid, frames)

    def _write_shard(self, sid: str, frames: list[pl.DataFrame]) -> None:
        frame = pl.concat(frames).sort("request_id")
        table = (
            frame.select(
                "request_id",
                pl.lit(sid).alias("shard_id"),
                "user_prompt",
                "est_input_tokens",
                "length_bucket",
                "request_bytes",
                "source",
                pl.col(LINE).alias("line"),
                pl.lit(self.gen).alias("generation"),
            )
            .to_arrow()
            .cast(WRITE_SCHEMA)
        )
        self.store.write_table(self.shard_path(sid), table, **SHARD_PARQUET)
        self.written_est[sid] = int(frame.get_column("est_input_tokens").cast(pl.Int64).sum() or 0)
        self.written[sid] = table.num_rows

    def totals(self, shard_ids: list[str]) -> dict[str, list[int]]:
        """``GenerationRecord.shard_totals`` of the shards written (in ``shard_ids`` order), once all are."""
        return {
            "items": [self.written[s] for s in shard_ids],
            "est_input_tokens": [self.written_est[s] for s in shard_ids],
        }


def _stratified_order(frame: pl.DataFrame, keep: np.ndarray) -> np.ndarray:
    """The rows to keep, reordered so that every length bucket is spread evenly over the sequence: key = (rank of
    the request ID within its bucket + 0.5) / bucket size, ties by bucket then position."""
    order = (
        frame.select("request_id", "length_bucket")
        .with_row_index("_i")
        .filter(pl.Series(keep, dtype=pl.Boolean))
        .with_columns(
            (
                (pl.col("request_id").rank("ordinal").over("length_bucket").cast(pl.Float64) - 0.5)
                / pl.len().over("length_bucket").cast(pl.Float64)
            ).alias("_key")
        )
        .sort("_key", "length_bucket", "_i")
    )
    return order.get_column("_i").to_numpy()
