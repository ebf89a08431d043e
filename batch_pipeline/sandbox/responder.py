"""Deterministic chat completions that honour the request's output contract."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from json.encoder import encode_basestring
from typing import Any

from batch_pipeline.sandbox.schema_fill import fill_schema, first_words
from batch_pipeline.sandbox.tokens import (
    content_text,
    count_tokens,
    message_tokens,
    request_input_tokens,
    truncate_tokens,
)

MARKER_RE = re.compile(r"\[\[sandbox:(\w+)\]\]")
SYSTEM_FINGERPRINT = "sandbox"
CACHE_MIN_TOKENS = 1024
REFUSAL = "I can't help with that."
# ``json.dumps(value, ensure_ascii=False)`` built an encoder at every call; one, made once, writes the same bytes
_DUMPS = json.JSONEncoder(ensure_ascii=False).encode


@dataclass(frozen=True)
class Completion:
    """One generated completion: the ChatCompletion body plus its token counts, and the body as compact JSON
    (``body_json``: what a batch's output line holds)."""

    body: dict[str, Any]
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    body_json: str | None = None


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    return [m for m in messages if isinstance(m, dict)] if isinstance(messages, list) else []


@dataclass(frozen=True, slots=True)
class ChatReading:
    """What an answer reads of a chat request's messages, found in one pass (each was a pass of its own, four a
    line): the messages that are objects, the last user text, the system/developer instructions and the markers."""

    messages: list[dict[str, Any]]
    user_text: str
    system_text: str
    marks: set[str]


def read_chat(body: dict[str, Any]) -> ChatReading:
    """``ChatReading`` of a body: ``last_user_text``, ``system_text`` and ``markers`` of it at once."""
    messages = _messages(body)
    user, system, marks = "", [], set()
    for message in messages:
        role = message.get("role")
        if role == "user":
            user = content_text(message.get("content"))
            if "[[sandbox:" in user:
                marks.update(MARKER_RE.findall(user))
        elif role in ("system", "developer"):
            system.append(content_text(message.get("content")))
    return ChatReading(messages, user, " ".join(system), marks)


def last_user_text(body: dict[str, Any]) -> str:
    """Text of the last ``user`` message ('' when there is none)."""
    for message in reversed(_messages(body)):
        if message.get("role") == "user":
            return content_text(message.get("content"))
    return ""


def markers(body: dict[str, Any]) -> set[str]:
    """The ``[[sandbox:NAME]]`` markers found in the user messages."""
    found: set[str] = set()
    for message in _messages(body):
        if message.get("role") == "user":
            text = content_text(message.get("content"))
            if "[[sandbox:" in text:  # a substring test before the regex scan of a long prompt
                found.update(MARKER_RE.findall(text))
    return found


def cacheable_prefix(body: dict[str, Any], messages: list[dict[str, Any]] | None = None) -> tuple[str, int] | None:
    """The leading system/developer message text and its tokens, if it is long enough to be cached (``messages``:
    the body's, when already read)."""
    messages = _messages(body) if messages is None else messages
    if not messages or messages[0].get("role") not in ("system", "developer"):
        return None
    tokens = message_tokens(messages[0], str(body.get("model") or ""))
    if tokens < CACHE_MIN_TOKENS:
        return None
    return content_text(messages[0].get("content")), tokens


def system_text(body: dict[str, Any]) -> str:
    """The system/developer instructions of a request (label descriptions live there)."""
    return " ".join(content_text(m.get("content")) for m in _messages(body) if m.get("role") in ("system", "developer"))


def render_content(body: dict[str, Any], reading: ChatReading | None = None) -> str:
    """The assistant text: a schema-valid JSON document for ``json_schema``, a JSON object for ``json_object``,
    otherwise a short sentence (``reading``: the body's, when already read)."""
    reading = read_chat(body) if reading is None else reading
    text = reading.user_text
    response_format = body.get("response_format")
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema") or {"type": "object"}
        return _dumps(fill_schema(schema, text, reading.system_text))
    snippet = " ".join(first_words(text, 8, MARKER_RE)) or "an empty message"
    if kind == "json_object":
        return _DUMPS({"sandbox": True, "answer": snippet})
    return f"Sandbox reply to: {snippet}."


@lru_cache(maxsize=1024)
def _short_answer_tokens(content: str) -> int:
    return count_tokens(content)


def _answer_tokens(content: str) -> int:
    """``count_tokens`` of an answer; a short one kept (a choice job's answers are a few labels, at every line)."""
    return _short_answer_tokens(content) if len(content) <= 64 else count_tokens(content)


def _dumps(value: Any) -> str:
    """``_DUMPS(value)``; an object of strings (a choice job's labels) by template, ~4x cheaper than the encoder."""
    if type(value) is dict and all(type(k) is str and type(v) is str for k, v in value.items()):
        return "{" + ", ".join(encode_basestring(k) + ": " + encode_basestring(v) for k, v in value.items()) + "}"
    return _DUMPS(value)


def _token_limit(body: dict[str, Any]) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


def chat_completion(
    body: dict[str, Any],
    *,
    completion_id: str,
    created: int,
    cached_tokens: int,
    truncate: bool = False,
    prompt_tokens: int | None = None,
    reading: ChatReading | None = None,
) -> Completion:
    """The ChatCompletion for a request body. ``truncate`` cuts the output in half (finish_reason ``length``);
    the marker ``[[sandbox:refuse]]`` gives ``content: null`` and a ``refusal``. ``prompt_tokens``: the
    ``request_input_tokens`` of ``body`` when already counted (a batch request, at create); ``reading``: its
    ``read_chat`` when already read (a batch line)."""
    reading = read_chat(body) if reading is None else reading
    content = render_content(body, reading)
    refusal = REFUSAL if "refuse" in reading.marks else None
    finish_reason = "stop"
    limit = _token_limit(body)
    produced = _answer_tokens(content)
    if truncate:
        limit = min(limit, produced // 2) if limit is not None else produced // 2
    completion = produced
    if limit is not None and (produced > limit or truncate):
        content = truncate_tokens(content, limit)
        finish_reason = "length"
        completion = count_tokens(content)
    if refusal is not None:
        finish_reason = "stop"
        completion = count_tokens(refusal)
    prompt = request_input_tokens(body) if prompt_tokens is None else prompt_tokens
    shown: str | None = content if refusal is None else None
    response = {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": str(body.get("model", "")),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": shown, "refusal": refusal, "annotations": []},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached_tokens, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": 0,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        },
        "service_tier": "default",
        "system_fingerprint": SYSTEM_FINGERPRINT,
    }
    encoded = None
    if type(completion_id) is str and type(created) is type(prompt) is type(completion) is type(cached_tokens) is int:
        encoded = _body_json(completion_id, created, response["model"], shown, refusal, finish_reason, prompt)
        encoded += _usage_json(prompt, completion, cached_tokens)
    return Completion(response, prompt, cached_tokens, completion, encoded)


def _text(value: str | None) -> str:
    """A string or null as the answer encoder writes it (compact, non-ASCII kept)."""
    return "null" if value is None else encode_basestring(value)


def _body_json(
    completion_id: str, created: int, model: str, shown: str | None, refusal: str | None, reason: str, prompt: int
) -> str:
    """``chat_completion``'s body up to its usage, as ``spooled_parts.encode`` writes it: by template, ~5x cheaper
    than the encoder's walk of the nested dict at every line of a batch (``test_answer_json`` checks the two)."""
    return (
        '{"id":' + encode_basestring(completion_id) + ',"object":"chat.completion","created":' + str(created)
        + ',"model":' + encode_basestring(model) + ',"choices":[{"index":0,"message":{"role":"assistant","content":'
        + _text(shown) + ',"refusal":' + _text(refusal) + ',"annotations":[]},"logprobs":null,"finish_reason":'
        + encode_basestring(reason) + '}],"usage":{"prompt_tokens":' + str(prompt)
    )  # fmt: skip


def _usage_json(prompt: int, completion: int, cached: int) -> str:
    """The rest of the body: ``usage`` from its completion tokens on, and the closing fields."""
    return (
        ',"completion_tokens":' + str(completion) + ',"total_tokens":' + str(prompt + completion)
        + ',"prompt_tokens_details":{"cached_tokens":' + str(cached) + ',"audio_tokens":0},'
        + '"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,'
        + '"rejected_prediction_tokens":0}},"service_tier":"default","system_fingerprint":'
        + encode_basestring(SYSTEM_FINGERPRINT) + "}"
    )  # fmt: skip


def poison_message(param: str) -> str:
    """What the ``poison`` marker's 400 says, on ``param``: the ``messages`` (a chat) or the ``input`` (embeddings)."""
    what = "context" if param == "messages" else param
    return f"This request is malformed or its {what} is too long (sandbox marker poison)."


def error_body(message: str, *, type: str, code: str | None, param: str | None = None) -> dict[str, Any]:
    """The error envelope carried by a failed request's response line."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}
