"""A batch's requests read from its spooled input file when they are run, not held parsed for the batch's life.

Parsed, a 50,000-line batch's requests were ~170 MB of dicts from create to end; twenty batches in flight at once
(a 1M-row job) were gigabytes. What stays in memory is each request's byte span in the input and its prompt tokens
(16 bytes and an int a line); a line is parsed again when its turn comes. The batch reads a hard link of the
input, so deleting the input file (which the API allows mid-batch) does not take the requests with it. A line is
read with ``pread`` on an open handle, not from a memory map: a map's pages count in the sandbox's RSS, the whole
input of every batch in flight by the end of the batch (~22 MB per 50,000 lines). A saved state names a sidecar of
the spans (``<link>.spans``, written at the first save), not the spans themselves: a state directory's
``state.json`` is rewritten at every change, and the spans of twenty batches in flight were ~40 MB of it each time.
"""

from __future__ import annotations

import json
import os
from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, overload


class SpooledRequests(Sequence[dict[str, Any]]):
    """``{"custom_id", "body", "line", "prompt_tokens"}`` by index, as ``parse_input`` gave them, from ``path``."""

    def __init__(self, path: Path, starts: array[int], ends: array[int], lines: array[int], tokens: array[int]):
        self.path = path
        self.starts, self.ends, self.lines, self.tokens = starts, ends, lines, tokens
        self._source: BinaryIO | None = None

    @classmethod
    def link(cls, source: Path, target: Path, content: bytes, requests: list[dict[str, Any]]) -> SpooledRequests:
        """The requests ``parse_input`` found in ``content`` (the bytes of ``source``), read from a hard link of
        ``source`` at ``target`` (a copy where the spool cannot link)."""
        try:
            os.link(source, target)
        except OSError:
            target.write_bytes(content)
        line_starts = array("q", [0])
        position = content.find(b"\n")
        while position >= 0:
            line_starts.append(position + 1)
            position = content.find(b"\n", position + 1)
        starts, ends, lines = array("q"), array("q"), array("q")
        for request in requests:
            number = int(request["line"])
            starts.append(line_starts[number - 1])
            ends.append(line_starts[number] - 1 if number < len(line_starts) else len(content))
            lines.append(number)
        tokens = array("q", (int(r.get("prompt_tokens") or 0) for r in requests))
        return cls(target, starts, ends, lines, tokens)

    def __len__(self) -> int:
        return len(self.starts)

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...
    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...
    def __getitem__(self, index: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if self._source is None:
            self._source = self.path.open("rb", buffering=0)
        start = self.starts[index]
        item = json.loads(os.pread(self._source.fileno(), self.ends[index] - start, start))
        return {
            "custom_id": item["custom_id"],
            "body": item["body"],
            "line": self.lines[index],
            "prompt_tokens": self.tokens[index],
        }

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SpooledRequests):
            return self.path == other.path and self._spans() == other._spans()
        return isinstance(other, list) and list(self) == other

    def _spans(self) -> tuple[array[int], ...]:
        return (self.starts, self.ends, self.lines, self.tokens)

    @property
    def spans_path(self) -> Path:
        """The sidecar a saved state reads the spans from."""
        return self.path.with_name(self.path.name + ".spans")

    def prompt_token_total(self) -> int:
        """The batch's prompt tokens (for the quota), without parsing a line."""
        return sum(self.tokens)

    def release(self) -> None:
        """The batch ended: close the handle and drop the link."""
        if self._source is not None:
            self._source.close()
            self._source = None
        self.path.unlink(missing_ok=True)
        self.spans_path.unlink(missing_ok=True)

    def to_json(self) -> dict[str, Any]:
        """The link's and the sidecar's names (resolved against the spool when loaded); the sidecar is written the
        first time (the spans never change)."""
        if not self.spans_path.exists():
            tmp = self.spans_path.with_name(self.spans_path.name + ".tmp")
            tmp.write_bytes(b"".join(values.tobytes() for values in self._spans()))
            os.replace(tmp, self.spans_path)
        return {"spooled": self.path.name, "spans": self.spans_path.name, "count": len(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any], spool: Path) -> SpooledRequests:
        """Inverse of ``to_json`` for a batch whose link is in ``spool``; a state saved with the spans themselves
        (starts, ends, lines, prompt_tokens lists) loads too."""
        if "spans" not in data:
            spans = [array("q", data[key]) for key in ("starts", "ends", "lines", "prompt_tokens")]
            return cls(spool / data["spooled"], *spans)
        count, values = int(data["count"]), array("q")
        values.frombytes((spool / data["spans"]).read_bytes())
        assert len(values) == 4 * count, f"{data['spans']}: {len(values)} values for {count} requests"
        spans = [values[i * count : (i + 1) * count] for i in range(4)]
        return cls(spool / data["spooled"], *spans)


def prompt_token_total(requests: Sequence[dict[str, Any]]) -> int:
    """A batch's prompt tokens, spooled (from its counts) or a list (from each request, as a saved state has it)."""
    if isinstance(requests, SpooledRequests):
        return requests.prompt_token_total()
    return sum(int(r["prompt_tokens"]) for r in requests)
