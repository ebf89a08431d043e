"""A running batch's answers appended to its output and error files in the spool as they are produced.

Held as ``LineResult`` objects until the batch ended, a 50,000-line batch's answers were ~114 MB of dicts for the
batch's whole in_progress and finalizing; twenty batches in flight (a 1M-row job) were gigabytes. Now each answer
is encoded as its output (or error) file line the moment it is produced and appended to ``<batch>.output.part``
(or ``.errors.part``), and a successful one's billing (custom_id and tokens) to ``<batch>.billing.part``. In memory:
the line count, the three parts' sizes and the token sums. When the batch ends the parts are renamed to its output
and error files and the billing part is read into the ledger. The sizes are saved with the state: a sandbox
restarted on its state directory cuts the parts back to them, so lines processed after the save run again.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

from batch_pipeline.sandbox.ids import stable_hex
from batch_pipeline.sandbox.store import BilledTokens

FLUSH_LINES = 2000  # answers are encoded at once but written this many lines at a time
PARTS = ("output", "errors", "billing")
TOTAL_KEYS = ("succeeded", "input_tokens", "cached_tokens", "output_tokens")
_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


class Answer(Protocol):
    """What a processed line gives (``batches.LineResult``)."""

    custom_id: str
    status_code: int
    request_id: str
    body: dict[str, Any]
    input_tokens: int
    cached_tokens: int
    output_tokens: int


def line_id(batch_id: str, custom_id: str) -> str:
    """The ``id`` of a request's line in the output or error file."""
    return "batch_req_" + stable_hex(batch_id, custom_id, "line")


class SpooledResults:
    """The answers of batch ``batch_id`` so far: ``len`` is how many, the lines are in the parts under ``root``."""

    def __init__(
        self,
        root: Path,
        batch_id: str,
        count: int = 0,
        sizes: dict[str, int] | None = None,
        totals: dict[str, int] | None = None,
    ) -> None:
        self.root, self.batch_id, self.count = root, batch_id, count
        self.sizes = {part: int((sizes or {}).get(part, 0)) for part in PARTS}
        self.totals = {key: int((totals or {}).get(key, 0)) for key in TOTAL_KEYS}
        self._pending: dict[str, list[str]] = {part: [] for part in PARTS}
        self._buffered = 0

    def path(self, part: str) -> Path:
        """Where part ``output``, ``errors`` or ``billing`` is written."""
        return self.root / f"{self.batch_id}.{part}.part"

    def __len__(self) -> int:
        return self.count

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SpooledResults) and self.to_json() == other.to_json()

    def append(self, result: Answer) -> None:
        """Encode one answer as its file line (and its billing, if it succeeded); written every ``FLUSH_LINES``."""
        response = {"status_code": result.status_code, "request_id": result.request_id, "body": result.body}
        line = {"id": line_id(self.batch_id, result.custom_id), "custom_id": result.custom_id}
        line.update(response=response, error=None)
        if result.status_code == 200:
            self._pending["output"].append(_ENCODE(line))
            tokens = (result.input_tokens, result.cached_tokens, result.output_tokens)
            self._pending["billing"].append(_ENCODE([result.custom_id, *tokens]))
            for key, value in zip(TOTAL_KEYS, (1, *tokens), strict=True):
                self.totals[key] += value
        else:
            self._pending["errors"].append(_ENCODE(line))
        self.count += 1
        self._buffered += 1
        if self._buffered >= FLUSH_LINES:
            self.flush()

    def add_errors(self, lines: Iterable[dict[str, Any]]) -> None:
        """Append error-file lines that are no answer (the requests an expired or cancelled batch never ran)."""
        for line in lines:
            self._pending["errors"].append(_ENCODE(line))
            self._buffered += 1
            if self._buffered >= FLUSH_LINES:
                self.flush()
        self.flush()

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

    def billing(self, provider: str, model: str | None, billed_at: float) -> Iterator[dict[str, Any]]:
        """The ledger rows of the successful answers, in processing order, read back from the billing part."""
        self.flush()
        if not self.sizes["billing"]:
            return
        with self.path("billing").open(encoding="utf-8") as source:
            for text in source:
                custom_id, input_tokens, cached_tokens, output_tokens = json.loads(text)
                tokens = BilledTokens(
                    input_tokens=input_tokens, cached_tokens=cached_tokens, output_tokens=output_tokens
                )
                yield tokens.ledger_row(provider, self.batch_id, custom_id, model, billed_at)

    def take(self, part: str, target: Path) -> int:
        """Move part ``output`` or ``errors`` to ``target`` (the batch ended); its size, 0 (and no file) if empty."""
        self.flush()
        size = self.sizes[part]
        if size:
            os.replace(self.path(part), target)
        else:
            self.path(part).unlink(missing_ok=True)
        return size

    def release(self) -> None:
        """The batch ended or the sandbox reset: whatever parts are left go."""
        for part in PARTS:
            self._pending[part].clear()
            self.path(part).unlink(missing_ok=True)

    def restore(self) -> None:
        """Back to the saved sizes: lines a part got after the state was saved are cut (they run again)."""
        for part in PARTS:
            path = self.path(part)
            with path.open("ab") as handle:
                handle.truncate(min(self.sizes[part], os.fstat(handle.fileno()).st_size))
            self.sizes[part] = path.stat().st_size

    def to_json(self) -> dict[str, Any]:
        """The counts the state keeps (the lines are in the parts)."""
        return {"spooled": self.batch_id, "count": self.count, "sizes": dict(self.sizes), "totals": dict(self.totals)}

    @classmethod
    def from_json(cls, data: dict[str, Any], root: Path) -> SpooledResults:
        """Inverse of ``to_json`` for a batch whose parts are in ``root``."""
        return cls(root, data["spooled"], int(data["count"]), data["sizes"], data["totals"])
