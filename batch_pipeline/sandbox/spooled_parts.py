"""A running batch's answers appended to part files in the spool as they are produced, for every provider.

Held as answer objects until the batch ended, a 50,000-line batch's answers were ~114 MB of dicts for the batch's
whole life; twenty batches in flight (a 1M-row job) were gigabytes. Each provider encodes an answer as its result
line the moment it is produced and appends it to ``<batch>.<part>.part`` (an output, errors or results part), and a
successful one's billing (custom_id, tokens, model) to ``<batch>.billing.part``. In memory: the answer count, the
parts' sizes and the provider's sums. When the batch ends the parts become its result files and the billing part is
read into the ledger, once. The sizes are saved with the state: a sandbox restarted on its state directory cuts the
parts back to them, so answers produced after the save are produced again.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from itertools import islice
from json.encoder import encode_basestring
from pathlib import Path
from typing import Any, ClassVar, Self

from batch_pipeline.sandbox.store import Bill, Tokens, ledger_row

FLUSH_LINES = 2000  # answers are encoded at once but written this many lines at a time
LEDGER_WRITE_ROWS = 2000  # a finished batch's billing goes to the ledger this many rows at a write
BILLING = "billing"
_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def encode(value: Any) -> str:
    """A result line as every provider's file has it: compact JSON, non-ASCII kept."""
    return _ENCODE(value)


_SCAN = json.JSONDecoder().scan_once
_JSON_WHITESPACE = " \t\n\r"


def decode_line(raw: bytes) -> Any:
    """``json.loads(raw)`` of a JSON line: the UTF-8 text scanned directly, without ``loads``' encoding detection and
    whitespace regexes (~1.8 us of each request line, read at create and again when it runs). Anything else (a
    byte-order mark, another encoding, leading whitespace, bad JSON) goes to ``json.loads``, which decodes it or
    raises as it would have."""
    try:
        text = raw.decode("utf-8")
        value, end = _SCAN(text, 0)
    except (UnicodeDecodeError, StopIteration, ValueError):
        return json.loads(raw)
    if end != len(text) and text[end:].strip(_JSON_WHITESPACE):
        return json.loads(raw)  # extra data after the value: its error
    return value


class SpooledParts:
    """The answers of batch ``batch_id`` so far: ``len`` is how many, their lines are in the parts under ``root``.

    Subclasses name their ``PARTS`` (the billing part is always there) and ``TOTAL_KEYS`` (their running sums), and
    encode one answer in their ``append``, with ``add`` and ``add_billing``."""

    PARTS: ClassVar[tuple[str, ...]] = ()
    TOTAL_KEYS: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        root: Path,
        batch_id: str,
        count: int = 0,
        sizes: dict[str, int] | None = None,
        totals: dict[str, int] | None = None,
        parts: Iterable[str] | None = None,
    ) -> None:
        self.root, self.batch_id, self.count = root, batch_id, count
        names = (*(self.PARTS if parts is None else parts), BILLING)
        self.sizes = {part: int((sizes or {}).get(part, 0)) for part in dict.fromkeys(names)}
        self.totals = {key: int((totals or {}).get(key, 0)) for key in self.TOTAL_KEYS}
        self._pending: dict[str, list[str]] = {part: [] for part in self.sizes}
        self._buffered = 0

    def path(self, part: str) -> Path:
        """Where a part is written."""
        return self.root / f"{self.batch_id}.{part}.part"

    def __len__(self) -> int:
        return self.count

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SpooledParts) and self.to_json() == other.to_json()

    def add(self, part: str, line: str) -> None:
        """Append an encoded line to a part (written every ``FLUSH_LINES`` lines)."""
        self._pending[part].append(line)
        self._buffered += 1
        if self._buffered >= FLUSH_LINES:
            self.flush()

    def add_billing(self, custom_id: str, tokens: Tokens, model: str | None = None, **extra: int) -> None:
        """Bill a successful answer when the batch ends: its tokens (and the model, a provider's own counts)."""
        row: list[Any] = [custom_id, tokens.input_tokens, tokens.cached_tokens, tokens.output_tokens]
        if model is None and not extra and type(custom_id) is str and all(type(n) is int for n in row[1:]):
            # the plain row by template (its generic encoding was a visible share of every answer)
            self.add(BILLING, "[" + encode_basestring(custom_id) + "," + ",".join(map(str, row[1:])) + "]")
            return
        if model is not None or extra:
            row.append(model)
        if extra:
            row.append(extra)
        self.add(BILLING, encode(row))

    def flush(self) -> None:
        """Write the encoded lines to their parts (before the state is saved: the sizes must be on disk)."""
        for part, lines in self._pending.items():
            if lines:
                data = ("\n".join(lines) + "\n").encode("utf-8")
                with self.path(part).open("ab") as out:
                    out.write(data)
                self.sizes[part] += len(data)
                lines.clear()
        self._buffered = 0

    def billing(
        self, provider: str, model: str | None, billed_at: float, batch_id: str = ""
    ) -> Iterator[dict[str, Any]]:
        """The ledger rows of the successful answers, in processing order, read back from the billing part
        (``model``: the batch's, unless a row names its own; ``batch_id``: as the ledger names the batch)."""
        self.flush()
        if not self.sizes[BILLING]:
            return
        batch_id = batch_id or self.batch_id
        with self.path(BILLING).open(encoding="utf-8") as source:
            for text in source:
                custom_id, input_tokens, cached_tokens, output_tokens, *rest = json.loads(text)
                row_model = rest[0] if rest and rest[0] is not None else model
                extra = rest[1] if len(rest) > 1 else {}
                tokens = (input_tokens, cached_tokens, output_tokens)
                yield ledger_row(provider, batch_id, custom_id, row_model, *tokens, billed_at, **extra)

    def take(self, part: str, target: Path) -> int:
        """Move a part to ``target`` (the batch ended); its size, 0 (and no file) if empty."""
        self.flush()
        size = self.sizes[part]
        if size:
            os.replace(self.path(part), target)
        else:
            self.path(part).unlink(missing_ok=True)
        return size

    def release(self) -> None:
        """The batch ended or the sandbox reset: whatever parts are left go."""
        for part in self.sizes:
            self._pending[part].clear()
            self.path(part).unlink(missing_ok=True)

    def restore(self) -> None:
        """Back to the saved sizes: lines a part got after the state was saved are cut (they run again)."""
        for part in self.sizes:
            path = self.path(part)
            with path.open("ab") as handle:
                handle.truncate(min(self.sizes[part], os.fstat(handle.fileno()).st_size))
            self.sizes[part] = path.stat().st_size

    def to_json(self) -> dict[str, Any]:
        """The counts the state keeps (the lines are in the parts)."""
        return {"spooled": self.batch_id, "count": self.count, "sizes": dict(self.sizes), "totals": dict(self.totals)}

    @classmethod
    def from_json(cls, data: dict[str, Any], root: Path) -> Self:
        """Inverse of ``to_json`` for a batch whose parts are in ``root``; a part with no size saved (added since)
        starts empty."""
        parts = [part for part in data["sizes"] if part != BILLING] if not cls.PARTS else None
        return cls(root, data["spooled"], int(data["count"]), data["sizes"], data["totals"], parts)

    @classmethod
    def rebuilt(cls, root: Path, batch_id: str, answers: Iterable[Any], **options: Any) -> Self:
        """Parts holding ``answers`` (a running batch saved with them as a list, before the spool): whatever
        parts were there go first."""
        parts = cls(root, batch_id, **options)
        parts.release()
        for answer in answers:
            parts.append(answer)
        parts.flush()
        return parts

    def append(self, answer: Any) -> None:
        """Encode one answer into its parts (each provider's own line)."""
        raise NotImplementedError


def bill_rows(bill: Bill, rows: Iterator[dict[str, Any]]) -> None:
    """Send ledger rows to ``bill`` ``LEDGER_WRITE_ROWS`` at a time (a 100,000-row batch is not one list)."""
    while chunk := list(islice(rows, LEDGER_WRITE_ROWS)):
        bill(chunk)
