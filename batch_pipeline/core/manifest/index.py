"""The on-disk request-ID index: one sorted Parquet file per generation of the IDs that generation added.

A later generation never loads every earlier ID at once unless they fit its memory bound: it reads the IDs
of one hash range at a time (``read_range``), and the files being sorted with small row groups lets Parquet
skip every row group outside the range by its statistics. Generations committed before the index existed
get their file on first use, from the request IDs of their shards.
"""

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import pyarrow as pa
import pyarrow.parquet as pq

from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store

INDEX_SCHEMA = pa.schema([("request_id", pa.string())])
ROW_GROUP = 65_536  # small enough that a 1/256 hash range reads ~1/256 of a large file


def index_path(paths: JobPaths, gen: int) -> str:
    return paths.id_index(gen)


def hex_range(prefix: str) -> tuple[str, str]:
    """The string bounds ``[lo, hi)`` of the IDs that start with the hex ``prefix``."""
    nxt = int(prefix, 16) + 1
    hi = format(nxt, f"0{len(prefix)}x") if nxt < 16 ** len(prefix) else "g"
    return prefix, hi


class IdIndex:
    """The request IDs of a job's committed generations (each generation's file holds what it added)."""

    def __init__(self, store: Store, paths: JobPaths, generations: dict[int, list[str]]):
        """``generations``: each committed generation and its new shards (to build a missing file)."""
        self.store, self.paths, self.generations = store, paths, generations

    def ensure(self) -> None:
        """Write the file of any committed generation that has none (jobs built before the index)."""
        for gen, shards in self.generations.items():
            rel = index_path(self.paths, gen)
            if self.store.exists(rel):
                continue
            tables = [self.store.read_part(self.paths.shard_items(s), ["request_id"]) for s in shards]
            ids = sorted(i for t in tables if t is not None for i in t.column("request_id").to_pylist())
            write_index(self.store, rel, [pa.array(ids, pa.string())])

    def files(self) -> list[str]:
        return [index_path(self.paths, g) for g in sorted(self.generations)]

    def read_all(self) -> list[str]:
        out: list[str] = []
        for rel in self.files():
            t = self.store.read_part(rel, ["request_id"])
            if t is not None:
                out.extend(t.column("request_id").to_pylist())
        return out

    def read_ranges(self, prefixes: list[str]) -> Iterator[tuple[str, pa.Array]]:
        """Each hash range's indexed IDs, for ascending hex ``prefixes`` of one length: every file is read once,
        row group by row group, alongside the ranges (they are sorted), so memory holds about one range."""
        cursors = [_Cursor(self.store, rel) for rel in self.files()]
        try:
            for prefix in prefixes:
                lo, hi = hex_range(prefix)
                parts = [c.take(lo, hi) for c in cursors]
                parts = [p for p in parts if len(p)]
                yield prefix, (pa.concat_arrays(parts) if parts else pa.array([], pa.string()))
        finally:
            for c in cursors:
                c.close()


class _Cursor:
    """A sorted index file read forward: ``take(lo, hi)`` returns its IDs in ``[lo, hi)``, for rising ranges."""

    def __init__(self, store: Store, rel: str):
        self._handle = store.fs.open_input_file(store.full(rel))
        self._file = pq.ParquetFile(self._handle)
        self._next_group = 0
        self._buffer = pa.array([], pa.string())

    def take(self, lo: str, hi: str) -> pa.Array:
        if not len(self._buffer):  # row groups wholly below the range are skipped by their statistics, unread
            while self._next_group < self._file.num_row_groups and (self._group_max(self._next_group) or hi) < lo:
                self._next_group += 1
        while self._next_group < self._file.num_row_groups and (not len(self._buffer) or self._buffer[-1].as_py() < hi):
            group = self._file.read_row_group(self._next_group, columns=["request_id"]).column(0).combine_chunks()
            self._next_group += 1
            self._buffer = pa.concat_arrays([self._buffer, group]) if len(self._buffer) else group
        buf = self._buffer
        start = _bisect(buf, lo)
        end = _bisect(buf, hi)
        out, self._buffer = buf.slice(start, end - start), buf.slice(end)
        return out

    def _group_max(self, group: int) -> str | None:
        stats = self._file.metadata.row_group(group).column(0).statistics
        return stats.max if stats is not None and stats.has_min_max else None

    def close(self) -> None:
        self._handle.close()


def _bisect(sorted_ids: pa.Array, value: str) -> int:
    """The first position whose ID is >= ``value``."""
    import bisect

    return bisect.bisect_left(_View(sorted_ids), value)


class _View:
    """Sequence view of an Arrow string array for ``bisect`` (O(log n) element reads)."""

    def __init__(self, arr: pa.Array):
        self._arr = arr

    def __len__(self) -> int:
        return len(self._arr)

    def __getitem__(self, i: int) -> str:
        return self._arr[i].as_py()


def write_index(store: Store, rel: str, runs: Iterable[pa.Array]) -> None:
    """``runs``: ID arrays, each sorted and every one after the one before (e.g. hash ranges in order)."""
    with index_writer(store, rel) as emit:
        for run in runs:
            emit(run)


@contextmanager
def index_writer(store: Store, rel: str) -> Iterator[Callable[[pa.Array], None]]:
    """An ``emit(run)`` that appends sorted ID runs to the index file ``rel`` (complete when the block exits)."""
    with store.parquet_writer(rel, INDEX_SCHEMA) as writer:

        def emit(run: pa.Array) -> None:
            if len(run):
                writer.write_table(
                    pa.table({"request_id": run.cast(pa.string())}, schema=INDEX_SCHEMA), row_group_size=ROW_GROUP
                )

        yield emit
