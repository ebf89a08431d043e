"""A Gemini file batch's answers so far, spooled (``sandbox/spooled_parts.py``): each is its responses-file line
(``{"key", "response"}`` or ``{"key", "error"}``) in ``<batch>.responses.part`` the moment it is produced; when the
batch ends with a responses file the part becomes it. (An inline batch's answers stay a list: they come back in
the operation itself, and its requests are at most the API's 20 MB payload.)"""

from __future__ import annotations

from batch_pipeline.sandbox.google.responder import GeminiAnswer
from batch_pipeline.sandbox.spooled_parts import SpooledParts, encode

RESPONSES = "responses"


class GeminiAnswers(SpooledParts):
    """The responses-file lines of a batch so far, and how many succeeded."""

    PARTS = (RESPONSES,)
    TOTAL_KEYS = ("succeeded",)

    def append(self, answer: GeminiAnswer) -> None:
        """Encode one answer as its responses-file line (and its billing, if it succeeded)."""
        if answer.succeeded:
            self.add(RESPONSES, encode({"key": answer.key, "response": answer.response}))
            self.add_billing(answer.key, answer.billed())
            self.totals["succeeded"] += 1
        else:
            self.add(RESPONSES, encode({"key": answer.key, "error": answer.error}))
        self.count += 1
