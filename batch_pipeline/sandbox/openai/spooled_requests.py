"""An OpenAI/Azure batch's requests read from its spooled input file (``sandbox/spooled_lines.py``) when they are
run. The batch reads a hard link of the input, so deleting the input file (which the API allows mid-batch) does not
take the requests with it; beside each line's span it keeps the line number and the prompt tokens counted at
create."""

from __future__ import annotations

import os
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from batch_pipeline.sandbox.spooled_lines import SpooledLines


class SpooledRequests(SpooledLines):
    """``{"custom_id", "body", "line", "prompt_tokens"}`` by index, as ``parse_input`` gave them, from ``path``."""

    COLUMNS = ("lines", "prompt_tokens")

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
        return cls(target, starts, ends, {"lines": lines, "prompt_tokens": tokens})

    def item(self, index: int, parsed: Any) -> dict[str, Any]:
        return {
            "custom_id": parsed["custom_id"],
            "body": parsed["body"],
            "line": self.columns["lines"][index],
            "prompt_tokens": self.columns["prompt_tokens"][index],
        }

    def prompt_token_total(self) -> int:
        """The batch's prompt tokens (for the quota), without parsing a line."""
        return sum(self.columns["prompt_tokens"])

    @classmethod
    def from_json(cls, data: dict[str, Any], spool: Path) -> SpooledRequests:
        """Inverse of ``to_json``; a state saved with the spans themselves (starts, ends, lines, prompt_tokens
        lists) loads too."""
        if "spans" not in data:
            starts, ends, lines, tokens = (
                array("q", data[key]) for key in ("starts", "ends", "lines", "prompt_tokens")
            )
            return cls(spool / data["spooled"], starts, ends, {"lines": lines, "prompt_tokens": tokens})
        return super().from_json(data, spool)


def prompt_token_total(requests: Sequence[dict[str, Any]]) -> int:
    """A batch's prompt tokens, spooled (from its counts) or a list (from each request, as a saved state has it)."""
    if isinstance(requests, SpooledRequests):
        return requests.prompt_token_total()
    return sum(int(r["prompt_tokens"]) for r in requests)
