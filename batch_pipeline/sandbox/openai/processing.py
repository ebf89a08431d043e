"""Running one request line of a batch (its answer goes to the batch's spooled results), and the error lines of
the requests an expired or cancelled batch never ran."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

from batch_pipeline.sandbox.batches import BatchRecord, LineResult
from batch_pipeline.sandbox.ids import stable_fraction, stable_hex
from batch_pipeline.sandbox.openai.embeddings import (
    EmbeddingRequestError,
    embedding_response,
    input_markers,
    input_texts,
)
from batch_pipeline.sandbox.openai.embeddings import input_tokens as embedding_tokens
from batch_pipeline.sandbox.openai.spooled_results import line_id
from batch_pipeline.sandbox.openai.validation import AZURE_CHAT_URL, CHAT_URL, EMBEDDINGS_URL
from batch_pipeline.sandbox.responder import (
    cacheable_prefix,
    chat_completion,
    error_body,
    last_user_text,
    poison_message,
    read_chat,
)
from batch_pipeline.sandbox.schema_fill import pick_label
from batch_pipeline.sandbox.tokens import request_input_tokens

# the ledger's provider
PROVIDER_BY_ENDPOINT = {CHAT_URL: "openai", AZURE_CHAT_URL: "azure_openai", EMBEDDINGS_URL: "openai"}
UNPROCESSED_ERRORS = {
    "expired": ("batch_expired", "This request could not be executed before the completion window expired."),
    "cancelled": ("batch_cancelled", "This request was not executed because the batch was cancelled."),
}


class LineRunner:
    """Produces a ``LineResult`` for a request, applying markers and the batch's scenario.

    Shared memory across batches: how often each custom_id was seen (``line_errors``) and which long system
    prompts were seen (prompt caching).
    """

    def __init__(self, seen_custom_ids: dict[str, int], seen_prompts: set[str]) -> None:
        self.seen_custom_ids = seen_custom_ids
        self.seen_prompts = seen_prompts

    def __call__(self, batch: BatchRecord, index: int, at: float) -> LineResult:
        request = batch.requests[index]
        custom_id, body = request["custom_id"], request["body"]
        sightings = self.seen_custom_ids.get(custom_id, 0)
        self.seen_custom_ids[custom_id] = sightings + 1
        request_id = "req_" + stable_hex(batch.id, custom_id, "request")
        if batch.endpoint == EMBEDDINGS_URL:
            return embedding_line(batch, index, custom_id, body, request_id, sightings)
        reading = read_chat(body)
        marks = reading.marks
        scenario = batch.scenario
        failed = fault_line(index, custom_id, request_id, "poison" in marks, "messages", scenario, sightings)
        if failed is not None:
            return failed
        cached = 0
        prefix = cacheable_prefix(body, reading.messages)
        if prefix is not None:
            key = hashlib.sha256(prefix[0].encode("utf-8")).hexdigest()
            cached = prefix[1] if key in self.seen_prompts else 0
            self.seen_prompts.add(key)
        steered = steer_labels(body, scenario, custom_id)
        completion = chat_completion(
            steered,
            completion_id="chatcmpl-" + stable_hex(batch.id, custom_id, "completion"),
            created=int(at),
            cached_tokens=cached,
            truncate="truncate" in marks,
            prompt_tokens=request.get("prompt_tokens"),
            reading=reading if steered is body else None,  # a steered body is read again
        )
        return LineResult(
            index,
            custom_id,
            200,
            request_id,
            completion.body,
            input_tokens=completion.prompt_tokens,
            cached_tokens=completion.cached_tokens,
            output_tokens=completion.completion_tokens,
            body_json=completion.body_json,
        )


def fault_line(
    index: int, custom_id: str, request_id: str, poisoned: bool, param: str, scenario: Any, sightings: int
) -> LineResult | None:
    """The line a request gets whatever it asks (chat or embeddings): the ``poison`` marker's 400 on ``param``
    (``messages`` or ``input``), or a fault of the ``line_errors`` scenario that is due; None when it is answered."""
    if poisoned:
        message = poison_message(param)
        body = error_body(message, type="invalid_request_error", code="context_length_exceeded", param=param)
        return LineResult(index, custom_id, 400, request_id, body)
    if scenario.line_error_due(custom_id, sightings):
        status, kind, code = scenario.line_error()
        message = f"The request failed with {code} (sandbox scenario line_errors)."
        return LineResult(index, custom_id, status, request_id, error_body(message, type=kind, code=code))
    return None


def embedding_line(
    batch: BatchRecord, index: int, custom_id: str, body: dict[str, Any], request_id: str, sightings: int
) -> LineResult:
    """One embeddings line: the poison marker, the ``line_errors`` scenario, then a deterministic vector (with the
    fault markers on the first sighting of the custom_id)."""
    poisoned = "poison" in input_markers(body)
    failed = fault_line(index, custom_id, request_id, poisoned, "input", batch.scenario, sightings)
    if failed is not None:
        return failed
    try:
        response, tokens = embedding_response(body, first_sighting=sightings == 0)
    except EmbeddingRequestError as exc:
        return LineResult(
            index,
            custom_id,
            400,
            request_id,
            error_body(str(exc), type="invalid_request_error", code=exc.code, param=exc.param),
        )
    return LineResult(index, custom_id, 200, request_id, response, input_tokens=tokens)


def billed_input_tokens(endpoint: str, request: dict[str, Any], scenario: Any) -> int:
    """The prompt tokens a batch request is billed for (its answer's ``prompt_tokens``), counted at create."""
    body = request["body"]
    if endpoint == EMBEDDINGS_URL:
        try:
            return embedding_tokens(input_texts(body))
        except EmbeddingRequestError:
            return 0
    return request_input_tokens(steer_labels(body, scenario, request["custom_id"]))


def steer_labels(body: dict[str, Any], scenario: Any, custom_id: str) -> dict[str, Any]:
    """skew_labels answers every label question with one label; wrong_labels answers a share of them with a
    label the text does not point to. Both work by a marker the label picker honours."""
    if scenario.name == "skew_labels":
        marker = f"[[sandbox:label={scenario.param('label')}]]"
    elif scenario.name == "wrong_labels" and stable_fraction("wrong_labels", custom_id) < float(
        scenario.param("share")
    ):
        text = last_user_text(body)
        right = pick_label_for(body, text)
        marker = f"[[sandbox:label=not:{right}]]" if right is not None else ""
    else:
        return body
    # a message that is not an object is kept as it came (the checks at create require only a list)
    messages = [dict(m) if isinstance(m, dict) else m for m in body.get("messages", [])]
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user" and isinstance(message.get("content"), str):
            message["content"] = message["content"] + " " + marker
            break
    return {**body, "messages": messages}


def pick_label_for(body: dict[str, Any], text: str) -> Any:
    """The label the sandbox would choose for this request (None when it asks for no label)."""
    fmt = body.get("response_format")
    schema = ((fmt or {}).get("json_schema") or {}).get("schema") if isinstance(fmt, dict) else None
    enum = (((schema or {}).get("properties") or {}).get("label") or {}).get("enum")
    return pick_label(enum, text) if enum else None


def unprocessed_lines(batch: BatchRecord) -> Iterator[dict[str, Any]]:
    """The error-file lines of the requests an expired or cancelled batch never ran (``response: null`` and an
    ``error``), in processing order; none for a batch that ran them all."""
    if batch.status not in UNPROCESSED_ERRORS:
        return
    code, message = UNPROCESSED_ERRORS[batch.status]
    for index in batch.order[len(batch.results) :]:
        custom_id = batch.requests[index]["custom_id"]
        yield {
            "id": line_id(batch.id, custom_id),
            "custom_id": custom_id,
            "response": None,
            "error": {"code": code, "message": message},
        }
