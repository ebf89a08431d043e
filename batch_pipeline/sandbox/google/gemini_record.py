"""One Gemini Developer API batch as the sandbox keeps it, and the long-running ``Operation`` it is shown as.

The lifecycle that moves it lives in ``gemini_batches.py``; this module is the record and its wire form: the
``GenerateContentBatch`` (or ``EmbedContentBatch``) metadata, ``batchStats``, and the output, a responses file or
the inline responses. A file batch's requests and answers are spooled (``SpooledRecord``); an inline batch's stay
lists in memory (they are the create's body, at most the API's 20 MB payload, and its answers come back in the
operation itself).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from batch_pipeline.sandbox.google.errors import status_object
from batch_pipeline.sandbox.google.gemini_answers import GeminiAnswers
from batch_pipeline.sandbox.google.gemini_embed import EMBED_METADATA_TYPE, EMBED_OUTPUT_TYPE
from batch_pipeline.sandbox.google.responder import GeminiAnswer
from batch_pipeline.sandbox.quotas import DEFAULT_ACCOUNT
from batch_pipeline.sandbox.scenarios import Scenario
from batch_pipeline.sandbox.spooled_lines import SpooledLines
from batch_pipeline.sandbox.spooled_record import SpooledRecord
from batch_pipeline.sandbox.store import rfc3339

EXPIRY_S = 48 * 3600
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED", "EXPIRED"})
# The ``@type`` URLs the live API answers with, on /v1 and /v1beta alike: its internal ``v1main`` package, not the
# version in the path (captured responses of real batches, file and inline, show exactly these strings).
METADATA_TYPE = "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch"
OUTPUT_TYPE = "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatchOutput"


@dataclass
class GeminiBatch(SpooledRecord):
    """All the sandbox knows about one batch. Times are clock seconds."""

    NESTED: ClassVar[dict[str, Any]] = {"results": GeminiAnswer}
    PARTS_TYPE = GeminiAnswers

    id: str
    display_name: str | None
    model: str
    input_file: str
    created_at: float
    scenario: Scenario
    # {"key", "request", "prompt_tokens"} (+ "metadata" for an inline request that has one); spooled for a file
    requests: list[dict[str, Any]] | SpooledLines
    order: Any  # the processing order: the spooled requests' ``order`` column, or a list
    invalid: str | None = None  # why the input does not parse: the batch will fail
    state: str = "BATCH_STATE_PENDING"
    results: list[GeminiAnswer] | GeminiAnswers = field(default_factory=list)
    cancel_at: float | None = None
    updated_at: float | None = None
    end_at: float | None = None
    output_file: str | None = None
    account: str = DEFAULT_ACCOUNT  # the key that created it: whose enqueued tokens it counts against
    inline: bool = False  # built from inline requests: answered in the operation, not in a responses file
    embed: bool = False  # an asyncBatchEmbedContent batch: EmbedContentRequests, answered with vectors
    totals: dict[str, int] | None = None  # once a file batch ended: its requests, answers and how many succeeded

    def keeps_lists(self) -> bool:
        return self.inline

    @property
    def expires_at(self) -> float:
        return self.created_at + EXPIRY_S

    @property
    def ended(self) -> bool:
        return self.state.removeprefix("BATCH_STATE_") in TERMINAL

    def stats(self) -> dict[str, str]:
        """``batchStats``: int64 counts as strings, and a count of 0 left out (proto3 JSON), as the API sends
        them (a pending batch has ``requestCount`` and ``pendingRequestCount`` only)."""
        tally = self.tally()
        ok = tally["succeeded"]
        pending = 0 if self.ended else tally["requests"] - tally["processed"]
        counts = {
            "requestCount": tally["requests"],
            "successfulRequestCount": ok,
            "failedRequestCount": tally["processed"] - ok,
            "pendingRequestCount": pending,
        }
        return {name: str(count) for name, count in counts.items() if count}

    @property
    def has_output(self) -> bool:
        """Ended with answers to give back (SUCCEEDED or CANCELLED; FAILED and EXPIRED give none)."""
        return self.state in ("BATCH_STATE_SUCCEEDED", "BATCH_STATE_CANCELLED")

    def inlined_responses(self) -> list[dict[str, Any]]:
        """The answered requests of an inline batch in input order: ``{"response"}`` or ``{"error"}`` (a
        ``google.rpc.Status`` without ``details``: the SDK's ``JobError`` types them as strings and refuses the
        detail objects) plus the request's ``metadata`` when it had one. A cancelled batch gives only what was
        answered before the cancel, so match on ``metadata``, not on position."""
        answered = sorted(zip(self.order, self.results), key=lambda pair: pair[0])
        out: list[dict[str, Any]] = []
        for index, result in answered:
            if result.succeeded:
                item: dict[str, Any] = {"response": result.response}
            else:
                item = {"error": {k: v for k, v in (result.error or {}).items() if k != "details"}}
            metadata = self.requests[index].get("metadata")
            if metadata is not None:
                item["metadata"] = metadata
            out.append(item)
        return out

    def _output(self, full: bool) -> dict[str, Any]:
        """``GenerateContentBatchOutput``: the responses file, or the inline responses (left out of a list's
        view, as the live ``batches.list`` leaves them out: get the batch to read them)."""
        if not self.inline:
            return {"responsesFile": self.output_file} if self.output_file else {}
        responses = self.inlined_responses() if full else []
        return {"inlinedResponses": {"inlinedResponses": responses} if responses else {}}

    def to_api(self, full: bool = True) -> dict[str, Any]:
        """The batch as the long-running ``Operation`` the API answers with (``full=False``: as listed)."""
        metadata: dict[str, Any] = {
            "@type": EMBED_METADATA_TYPE if self.embed else METADATA_TYPE,
            "model": self.model,
            "displayName": self.display_name or "",
            "createTime": rfc3339(self.created_at),
            "updateTime": rfc3339(self.updated_at or self.created_at),
            "batchStats": self.stats(),
            "state": self.state,
            "name": f"batches/{self.id}",
        }
        if not self.inline:  # the live API does not echo inline requests back
            metadata["inputConfig"] = {"fileName": self.input_file}
        if self.end_at is not None:
            metadata["endTime"] = rfc3339(self.end_at)
        output = self._output(full) if self.has_output else {}
        if output:
            metadata["output"] = output
        operation: dict[str, Any] = {"name": f"batches/{self.id}", "metadata": metadata, "done": self.ended}
        if self.state == "BATCH_STATE_FAILED":
            operation["error"] = status_object(400, self.invalid or "The batch failed.")
        elif self.ended:
            operation["response"] = {"@type": EMBED_OUTPUT_TYPE if self.embed else OUTPUT_TYPE, **output}
        return operation
