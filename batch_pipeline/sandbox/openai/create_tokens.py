"""What a batch keeps of each good request while its input file is parsed at create: its custom_id, its line and
the prompt tokens it is billed for (for its answer and for the enqueued-token quota), not its body: the line is
parsed again from the spool when it runs, and 50,000 parsed bodies were ~200 MB of the sandbox's peak at every
create.

A chat request's tokens are counted a slice of requests at a time (``tokens.input_tokens_many``): a batch's
prompts share most of their words, and the exact count of each prompt by itself was the largest share of the
sandbox's CPU per request."""

from __future__ import annotations

from typing import Any

from batch_pipeline.sandbox.openai.processing import billed_input_tokens, steer_labels
from batch_pipeline.sandbox.openai.validation import EMBEDDINGS_URL
from batch_pipeline.sandbox.scenarios import Scenario
from batch_pipeline.sandbox.tokens import input_tokens_many, request_input_parts

COUNT_EVERY = 2048  # requests whose texts are counted together: their prompts, ~2 MB at ~1,000 characters each
COUNT_CHARS = 4_000_000  # or fewer, when their prompts are long: what is held until it is counted


class RequestKeeper:
    """Called with each good request as ``parse_input`` finds it; returns what is kept of it, whose
    ``prompt_tokens`` is filled in by the time ``finish`` returns. A ``fail_validation`` batch never runs: its
    tokens are not counted."""

    def __init__(self, endpoint: str, scenario: Scenario) -> None:
        self.endpoint = endpoint
        self.scenario = scenario
        self.counted = scenario.name != "fail_validation"
        self._waiting: list[tuple[dict[str, Any], int, int]] = []  # (kept, how many texts, fixed tokens)
        self._texts: list[str] = []
        self._chars = 0
        self._model = ""

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        kept = {"custom_id": request["custom_id"], "line": request["line"], "prompt_tokens": 0}
        if not self.counted:
            return kept
        if self.endpoint == EMBEDDINGS_URL:
            kept["prompt_tokens"] = billed_input_tokens(self.endpoint, request, self.scenario)
            return kept
        # what ``billed_input_tokens`` counts of a chat request: the body as the scenario steers it
        body = steer_labels(request["body"], self.scenario, request["custom_id"])
        texts, fixed, model = request_input_parts(body)
        if model != self._model or len(self._waiting) >= COUNT_EVERY or self._chars >= COUNT_CHARS:
            self.finish()
            self._model = model
        self._waiting.append((kept, len(texts), fixed))
        self._texts.extend(texts)
        self._chars += sum(map(len, texts))
        return kept

    def finish(self) -> None:
        """Count the texts of the requests kept so far and fill in their ``prompt_tokens``."""
        counts = input_tokens_many(self._texts, self._model)
        at = 0
        for kept, texts, fixed in self._waiting:
            kept["prompt_tokens"] = fixed + sum(counts[at : at + texts])
            at += texts
        self._waiting, self._texts, self._chars = [], [], 0
