"""An OpenAI/Azure batch's answers so far, spooled (``sandbox/spooled_parts.py``): each answer is its output (or
error) file line in ``<batch>.output.part`` (``.errors.part``) the moment it is produced; when the batch ends the
parts are renamed to its output and error files."""

from __future__ import annotations

from collections.abc import Iterable
from json.encoder import encode_basestring
from typing import Any, Protocol

from batch_pipeline.sandbox.ids import stable_hex
from batch_pipeline.sandbox.spooled_parts import SpooledParts, encode


class Answer(Protocol):
    """What a processed line gives (``batches.LineResult``)."""

    custom_id: str
    status_code: int
    request_id: str
    body: dict[str, Any]
    input_tokens: int
    cached_tokens: int
    output_tokens: int


def output_line_json(line_id: str, answer: Answer, body_json: str) -> str:
    """``encode`` of the answer's file line ``{"id", "custom_id", "response", "error": null}`` around its body
    already encoded: by template, the generic encoder's walk of the whole line was ~9 us of every answer."""
    return (
        '{"id":' + encode_basestring(line_id) + ',"custom_id":' + encode_basestring(answer.custom_id)
        + ',"response":{"status_code":' + str(answer.status_code) + ',"request_id":'
        + encode_basestring(answer.request_id) + ',"body":' + body_json + '},"error":null}'
    )  # fmt: skip


def line_id(batch_id: str, custom_id: str) -> str:
    """The ``id`` of a request's line in the output or error file."""
    return "batch_req_" + stable_hex(batch_id, custom_id, "line")


class SpooledResults(SpooledParts):
    """The output and error lines of batch ``batch_id`` so far, and the succeeded lines' token sums."""

    PARTS = ("output", "errors")
    TOTAL_KEYS = ("succeeded", "input_tokens", "cached_tokens", "output_tokens")

    def append(self, answer: Answer) -> None:
        """Encode one answer as its file line (and its billing, if it succeeded)."""
        body_json = getattr(answer, "body_json", None)
        if body_json is not None:  # a chat answer, its body already encoded
            text = output_line_json(line_id(self.batch_id, answer.custom_id), answer, body_json)
        else:
            response = {"status_code": answer.status_code, "request_id": answer.request_id, "body": answer.body}
            line = {"id": line_id(self.batch_id, answer.custom_id), "custom_id": answer.custom_id}
            line.update(response=response, error=None)
            text = encode(line)
        if answer.status_code == 200:
            self.add("output", text)
            self.add_billing(answer.custom_id, answer)  # an answer holds its billed tokens
            totals = self.totals
            totals["succeeded"] += 1
            totals["input_tokens"] += answer.input_tokens
            totals["cached_tokens"] += answer.cached_tokens
            totals["output_tokens"] += answer.output_tokens
        else:
            self.add("errors", text)
        self.count += 1

    def add_errors(self, lines: Iterable[dict[str, Any]]) -> None:
        """Append error-file lines that are no answer (the requests an expired or cancelled batch never ran)."""
        for line in lines:
            self.add("errors", encode(line))
        self.flush()
