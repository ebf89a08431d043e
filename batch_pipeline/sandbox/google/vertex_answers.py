"""A Vertex job's requests and prediction lines in the spool (issue 19), not in memory for the job's life.

Its input objects are downloaded to the spool one at a time and read a line at a time into ``<job>.requests`` (a
JSON line each, read back by span when run: ``sandbox/spooled_lines.py``), hashed as they are read for the
processing order. Each prediction line is appended to ``<job>.predictions.part`` the moment it is produced, and a
billed request's tokens to the billing part (``sandbox/spooled_parts.py``); when the job ends the part becomes
``predictions.jsonl`` on GCS and the billing part goes to the ledger, once.
"""

from __future__ import annotations

import hashlib
import json
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batch_pipeline.sandbox.batches import digest_order
from batch_pipeline.sandbox.google.vertex_gcs import GcsUnavailable, SandboxGcs
from batch_pipeline.sandbox.spooled_lines import SpooledLines
from batch_pipeline.sandbox.spooled_parts import SpooledParts, encode
from batch_pipeline.sandbox.store import BilledTokens

PREDICTIONS = "predictions"


def parse_lines(lines: Iterable[bytes]) -> Iterator[dict[str, Any]]:
    """The ``request`` of each input line (a line that is not ``{"request": {...}}`` keeps its text under
    ``_invalid``: it becomes a failed prediction line). ``lines`` split as ``bytes.splitlines`` splits."""
    number = 0
    for raw in lines:
        for line in raw.splitlines():
            number += 1
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                request = obj.get("request") if isinstance(obj, dict) else None
                if not isinstance(request, dict):
                    raise ValueError("the line has no request object")
            except ValueError as exc:
                request = {"_invalid": f"line {number}: {exc}"}
            yield request


def spool_input(gcs: SandboxGcs, uris: list[str], path: Path) -> tuple[SpooledLines, str | None]:
    """The requests of the input objects at ``uris`` written to ``path`` (each object downloaded beside it, read
    and dropped) with their processing order as the ``order`` column, and why reading stopped (None: it did not).
    The order is the one the sandbox drew from all the requests held at once."""
    digest = hashlib.sha256()
    failure: list[str] = []

    def requests() -> Iterator[dict[str, Any]]:
        download = path.with_name(path.name + ".input")
        first = True
        try:
            for uri in uris:
                gcs.download(uri, download)
                with download.open("rb") as source:
                    for request in parse_lines(source):
                        digest.update((b"" if first else b"\n") + json.dumps(request, sort_keys=True).encode())
                        first = False
                        yield request
        except GcsUnavailable as exc:
            failure.append(str(exc))
        finally:
            download.unlink(missing_ok=True)

    lines = SpooledLines.write(path, requests())
    lines.columns["order"] = array("q", digest_order(digest.hexdigest(), len(lines)))
    return lines, failure[0] if failure else None


@dataclass
class VertexAnswer:
    """One prediction line, and what its request is billed (``custom_id`` and ``tokens``) if it succeeded."""

    line: dict[str, Any]
    custom_id: str | None = None
    tokens: BilledTokens | None = None

    @classmethod
    def saved(cls, lines: list[dict[str, Any]], billing: list[dict[str, Any]]) -> list[VertexAnswer]:
        """The answers of a job saved before the spool: its prediction lines, each succeeded one with its row of
        ``billing`` (the unbilled ledger rows, in the same order; none once the job has billed)."""
        rows = iter(billing)
        answers = []
        for line in lines:
            row = None if line["status"] else next(rows, None)
            tokens = None
            if row is not None:
                counts = {key: int(row[key]) for key in ("input_tokens", "cached_tokens", "output_tokens")}
                tokens = BilledTokens(**counts)
            answers.append(cls(line, row["custom_id"] if row is not None else None, tokens))
        return answers


class VertexAnswers(SpooledParts):
    """The prediction lines of a job so far (``<job>.predictions.part``) and how many succeeded."""

    PARTS = (PREDICTIONS,)
    TOTAL_KEYS = ("succeeded",)

    def append(self, answer: VertexAnswer) -> None:
        """Encode one prediction line (and its billing, if it is billed)."""
        self.add(PREDICTIONS, encode(answer.line))
        if not answer.line["status"]:
            self.totals["succeeded"] += 1
        if answer.custom_id is not None and answer.tokens is not None:
            self.add_billing(answer.custom_id, answer.tokens)
        self.count += 1
