"""The billing ledger as an append-only JSONL file, with its row count and token totals kept in memory.

A 1M-request job bills 1M rows; as a list of dicts they were hundreds of MB of the sandbox's peak. The rows go to
``ledger.jsonl`` in the spool as they are billed; ``/_sandbox/ledger`` reads them back (a page at a time if asked).
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from itertools import islice
from json.encoder import encode_basestring
from pathlib import Path
from typing import Any

LEDGER_FILE = "ledger.jsonl"
TOKEN_KEYS = ("input_tokens", "cached_tokens", "output_tokens")
_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
ROW_KEYS = ("provider", "batch_id", "custom_id", "model", *TOKEN_KEYS, "billed_at")  # ``BilledTokens.ledger_row``'s


def row_json(entry: dict[str, Any]) -> str:
    """A row as its ledger line (compact JSON, non-ASCII kept). A row of ``ROW_KEYS`` with strings, integers and a
    finite float time (every row of a batch without a provider's own counts) is written by template: the generic
    encoder was ~2x its cost at every billed request."""
    if tuple(entry) == ROW_KEYS:
        provider, batch_id, custom_id, model, tokens_in, cached, tokens_out, at = entry.values()
        if (
            type(provider) is str
            and type(batch_id) is str
            and type(custom_id) is str
            and (model is None or type(model) is str)
            and type(tokens_in) is int
            and type(cached) is int
            and type(tokens_out) is int
            and type(at) is float
            and math.isfinite(at)
        ):
            return (
                '{"provider":' + encode_basestring(provider) + ',"batch_id":' + encode_basestring(batch_id)
                + ',"custom_id":' + encode_basestring(custom_id) + ',"model":'
                + ("null" if model is None else encode_basestring(model)) + ',"input_tokens":' + str(tokens_in)
                + ',"cached_tokens":' + str(cached) + ',"output_tokens":' + str(tokens_out) + ',"billed_at":'
                + float.__repr__(at) + "}"
            )  # fmt: skip
    return _ENCODE(entry)


class Ledger:
    """Billing rows appended to ``path``; ``len`` and ``totals`` without reading the file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.count = 0
        self.totals: Counter[str] = Counter()
        self.path.touch(exist_ok=True)  # a state directory's rows stay until the saved state says how many count

    def clear(self) -> None:
        """No rows."""
        self.path.write_bytes(b"")
        self.count = 0
        self.totals = Counter()

    def append(self, entry: dict[str, Any]) -> None:
        """Bill one row."""
        self.extend((entry,))

    def extend(self, entries: Iterable[dict[str, Any]]) -> None:
        """Bill rows, in one write."""
        rows = list(entries)
        if not rows:
            return
        lines = [row_json(entry) for entry in rows]
        for key in TOKEN_KEYS:  # one Counter update per key and write, not per key and row
            self.totals[key] += sum(int(entry.get(key) or 0) for entry in rows)
        with self.path.open("a", encoding="utf-8") as out:
            out.write("\n".join(lines) + "\n")
        self.count += len(lines)

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self.rows()

    def rows(self, offset: int = 0, limit: int | None = None) -> Iterator[dict[str, Any]]:
        """The rows from ``offset`` (0-based), at most ``limit`` of them, in billing order."""
        with self.path.open(encoding="utf-8") as source:
            stop = None if limit is None else offset + limit
            for line in islice(source, offset, stop):
                yield json.loads(line)

    def size(self) -> int:
        """The file's length in bytes (saved with the state, so a restart drops rows billed after the save)."""
        return self.path.stat().st_size

    def restore(self, saved_rows: list[dict[str, Any]] | None, saved_bytes: int | None) -> None:
        """Back to a saved state: the rows of a state saved before the ledger was a file (``saved_rows``), or the
        file cut to the ``saved_bytes`` it had at the save."""
        if saved_rows is not None:
            self.clear()
            self.extend(saved_rows)
            return
        if saved_bytes is None or not self.path.exists():
            self.clear()
            return
        with self.path.open("r+b") as handle:
            handle.truncate(min(saved_bytes, os.fstat(handle.fileno()).st_size))
        self.count, self.totals = 0, Counter()
        for entry in self.rows():
            self.count += 1
            for key in TOKEN_KEYS:
                self.totals[key] += int(entry.get(key) or 0)
