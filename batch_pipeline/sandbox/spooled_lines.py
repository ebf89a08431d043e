"""A batch's requests read from a JSONL file in the spool when they are run, not held parsed for the batch's life.

Parsed, a 50,000-line batch's requests were ~170 MB of dicts from create to end; twenty batches in flight at once
(a 1M-row job) were gigabytes. What stays in memory is each request's byte span in the file (16 bytes a line) and
whatever per-line numbers a provider keeps beside it (its ``columns``: prompt tokens, the processing order); a
line is parsed again when its turn comes. A line is read with ``pread`` on an open handle, not from a memory map:
a map's pages count in the sandbox's RSS, the whole input of every batch in flight by the end of the batch. A saved
state names a sidecar of the spans and columns (``<file>.spans``, written at the first save), not the numbers
themselves: ``state.json`` is rewritten at every change, and twenty batches' spans were ~40 MB of it each time.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, ClassVar, Self, overload

from batch_pipeline.sandbox.spooled_parts import decode_line, encode


class SpooledLines(Sequence[dict[str, Any]]):
    """The JSON lines of ``path`` by index (the object of each line; subclasses add their columns to it)."""

    COLUMNS: ClassVar[tuple[str, ...]] = ()  # the columns of a state saved without their names

    def __init__(self, path: Path, starts: array[int], ends: array[int], columns: dict[str, array[int]] | None = None):
        self.path, self.starts, self.ends = path, starts, ends
        self.columns = dict(columns or {})
        self._source: BinaryIO | None = None

    @classmethod
    def write(cls, path: Path, items: Iterable[dict[str, Any]], **columns: Iterable[int]) -> Self:
        """``items`` written one JSON line each to ``path`` (the batch's own copy of its requests)."""
        starts, ends = array("q"), array("q")
        position = 0
        with path.open("wb") as out:
            for item in items:
                data = encode(item).encode("utf-8") + b"\n"
                out.write(data)
                starts.append(position)
                position += len(data)
                ends.append(position - 1)
        return cls(path, starts, ends, {name: array("q", values) for name, values in columns.items()})

    def __len__(self) -> int:
        return len(self.starts)

    def parsed(self, index: int) -> Any:
        """Line ``index`` parsed as it is in the file."""
        if self._source is None:
            self._source = self.path.open("rb", buffering=0)
        start = self.starts[index]
        return decode_line(os.pread(self._source.fileno(), self.ends[index] - start, start))

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...
    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...
    def __getitem__(self, index: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return self.item(index, self.parsed(index))

    def item(self, index: int, parsed: Any) -> dict[str, Any]:
        """The request of line ``index`` (``parsed``: its line's object)."""
        return dict(parsed)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SpooledLines):
            return self.path == other.path and self._arrays() == other._arrays()
        return isinstance(other, list) and list(self) == other

    def column(self, name: str) -> array[int]:
        """A per-line column kept beside the spans."""
        return self.columns[name]

    def _arrays(self) -> list[array[int]]:
        return [self.starts, self.ends, *self.columns.values()]

    @property
    def spans_path(self) -> Path:
        """The sidecar a saved state reads the spans and columns from."""
        return self.path.with_name(self.path.name + ".spans")

    def close(self) -> None:
        """Close the handle lines are read with (opened again if one is read)."""
        if self._source is not None:
            self._source.close()
            self._source = None

    def release(self) -> None:
        """The batch ended: close the handle and drop the file and its sidecar."""
        self.close()
        self.path.unlink(missing_ok=True)
        self.spans_path.unlink(missing_ok=True)

    def to_json(self) -> dict[str, Any]:
        """The file's and the sidecar's names (resolved against the spool when loaded); the sidecar is written the
        first time (the spans never change)."""
        if not self.spans_path.exists():
            tmp = self.spans_path.with_name(self.spans_path.name + ".tmp")
            tmp.write_bytes(b"".join(values.tobytes() for values in self._arrays()))
            os.replace(tmp, self.spans_path)
        data: dict[str, Any] = {"spooled": self.path.name, "spans": self.spans_path.name, "count": len(self)}
        if tuple(self.columns) != self.COLUMNS:
            data["columns"] = list(self.columns)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any], spool: Path) -> Self:
        """Inverse of ``to_json`` for a batch whose file is in ``spool``."""
        names = data.get("columns", cls.COLUMNS)
        count, values = int(data["count"]), array("q")
        values.frombytes((spool / data["spans"]).read_bytes())
        assert len(values) == (2 + len(names)) * count, f"{data['spans']}: {len(values)} values for {count} lines"
        spans = [values[i * count : (i + 1) * count] for i in range(2 + len(names))]
        return cls(spool / data["spooled"], spans[0], spans[1], dict(zip(names, spans[2:], strict=True)))
