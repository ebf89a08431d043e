"""An Anthropic message batch's answers so far, spooled (``sandbox/spooled_parts.py``): each is its results-file line
(``{"custom_id", "result"}``) in ``<batch>.results.part`` the moment it is produced; when the batch ends the lines of
the requests never run are appended and the part becomes the results file."""

from __future__ import annotations

from collections.abc import Iterable

from batch_pipeline.sandbox.anthropic.responder import AnthropicResult
from batch_pipeline.sandbox.spooled_parts import SpooledParts, encode

RESULTS = "results"


class AnthropicAnswers(SpooledParts):
    """The result lines of a batch so far, and how many succeeded."""

    PARTS = (RESULTS,)
    TOTAL_KEYS = ("succeeded",)

    def append(self, answer: AnthropicResult) -> None:
        """Encode one answer as its results-file line (and its billing, if it succeeded)."""
        self.add(RESULTS, encode({"custom_id": answer.custom_id, "result": answer.result}))
        if answer.succeeded:
            cache_writes = answer.cache_creation_input_tokens
            self.add_billing(answer.custom_id, answer.billed(), answer.model, cache_creation_input_tokens=cache_writes)
            self.totals["succeeded"] += 1
        self.count += 1

    def add_unprocessed(self, custom_ids: Iterable[str], kind: str) -> None:
        """The lines of the requests never run (``canceled`` or ``expired``), after the answers."""
        for custom_id in custom_ids:
            self.add(RESULTS, encode({"custom_id": custom_id, "result": {"type": kind}}))
        self.flush()
