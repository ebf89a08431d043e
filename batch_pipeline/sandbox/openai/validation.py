"""Validation of a batch input file (JSONL of chat-completion requests, or of embeddings requests)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from batch_pipeline.sandbox.spooled_parts import decode_line

MAX_LINES = 50_000
MAX_BYTES = 200 * 1024 * 1024
MAX_REPORTED_ERRORS = 1000
CHAT_URL = "/v1/chat/completions"
EMBEDDINGS_URL = "/v1/embeddings"  # lines carry body.input (and dimensions, encoding_format) in place of messages
AZURE_CHAT_URL = "/chat/completions"  # Azure OpenAI: the batch endpoint and the lines' url, relative


@dataclass
class ParsedInput:
    """The requests of an input file and the problems found (``BatchError`` dicts with 1-based ``line``)."""

    requests: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    model: str | None = None


def _error(code: str, message: str, line: int | None, param: str | None = None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param, "line": line}


def _check_line(number: int, raw: bytes, endpoint: str) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(request, None) for a good line, (None, error) otherwise."""
    try:
        item = decode_line(raw)
    except ValueError:
        return None, _error("invalid_json_line", f"Line {number} is not valid JSON.", number)
    if not isinstance(item, dict):
        return None, _error("invalid_json_line", f"Line {number} is not a JSON object.", number)
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return None, _error("missing_custom_id", "Each request needs a non-empty custom_id.", number, "custom_id")
    if item.get("method") != "POST":
        return None, _error("invalid_method", "The method must be POST.", number, "method")
    if item.get("url") != endpoint:
        return None, _error("invalid_url", f"The url must be {endpoint}, matching the batch endpoint.", number, "url")
    body = item.get("body")
    if not isinstance(body, dict):
        return None, _error("missing_required_parameter", "The request has no body object.", number, "body")
    if not isinstance(body.get("model"), str) or not body["model"]:
        return None, _error("missing_required_parameter", "body.model is required.", number, "body.model")
    if endpoint == EMBEDDINGS_URL:
        value = body.get("input")
        if not (isinstance(value, str) and value) and not (
            isinstance(value, list) and value and all(isinstance(v, str) and v for v in value)
        ):
            return None, _error(
                "missing_required_parameter",
                "body.input must be a non-empty string or list of strings.",
                number,
                "body.input",
            )
        return {"custom_id": custom_id, "body": body, "line": number}, None
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return None, _error("missing_required_parameter", "body.messages is required.", number, "body.messages")
    return {"custom_id": custom_id, "body": body, "line": number}, None


def parse_input(
    content: bytes, endpoint: str = CHAT_URL, keep: Callable[[dict[str, Any]], dict[str, Any]] | None = None
) -> ParsedInput:
    """Parse and check every line: JSON object, unique custom_id, POST, url, body.model and body.messages,
    one model per file, at most 50,000 requests and 200 MB. ``keep``: what of each good request is kept (all of
    it by default), called as it is found so that the parsed bodies need not all be held at once."""
    parsed = ParsedInput()
    if len(content) > MAX_BYTES:
        parsed.errors.append(_error("file_too_large", f"The input file exceeds {MAX_BYTES} bytes.", None))
        return parsed
    seen: set[str] = set()
    for number, raw in enumerate(content.split(b"\n"), start=1):
        if not raw.strip():
            continue
        request, error = _check_line(number, raw, endpoint)
        if request is not None:
            model = request["body"]["model"]
            if request["custom_id"] in seen:
                request, error = (
                    None,
                    _error(
                        "duplicate_custom_id", f"custom_id {request['custom_id']!r} is used twice.", number, "custom_id"
                    ),
                )
            elif parsed.model is not None and model != parsed.model:
                request, error = (
                    None,
                    _error(
                        "mismatched_model",
                        f"All requests must use one model: {model!r} differs from {parsed.model!r}.",
                        number,
                        "body.model",
                    ),
                )
            else:
                parsed.model = parsed.model or model
        if error is not None:
            if len(parsed.errors) < MAX_REPORTED_ERRORS:
                parsed.errors.append(error)
            continue
        assert request is not None
        seen.add(request["custom_id"])
        parsed.requests.append(request if keep is None else keep(request))
    if not parsed.requests and not parsed.errors:
        parsed.errors.append(_error("empty_file", "The input file has no requests.", None))
    if len(parsed.requests) > MAX_LINES:
        parsed.errors.append(_error("too_many_requests", f"At most {MAX_LINES} requests per batch.", None))
    return parsed
