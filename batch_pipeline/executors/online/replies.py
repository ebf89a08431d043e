"""One reply of an OpenAI-compatible endpoint: sorted by the one error table, then made a ``RAW_RESULT_SCHEMA`` row."""

import json
from typing import Any

from batch_pipeline.core.error_table import Family, Where, decide
from batch_pipeline.executors.online.transport import Reply
from batch_pipeline.executors.provider_errors import redact


class Outcome:
    """How to treat one reply: ``ok``, ``poison``, ``transient`` or ``systemic``, with the code and message."""

    __slots__ = ("kind", "status", "code", "message", "payload")

    def __init__(self, kind: str, status: int | None, code: str | None, message: str, payload: str) -> None:
        self.kind, self.status, self.code, self.message, self.payload = kind, status, code, message, payload


def classify(reply: Reply) -> Outcome:
    """Sort one reply into ok / poison / transient / systemic by the one error table (``core/error_table.py``; the
    provider's ``x-should-retry`` decides between transient and poison)."""
    if reply.status is None:  # no answer: the table's row for our transport's failure (timeout, connection_error)
        failure = reply.failure or "connection_error"
        decision = decide(Family.OPENAI, None, failure, reply.detail, where=Where.REQUEST)
        return Outcome(decision.kind.value, None, failure, reply.detail, "")
    text = reply.body.decode("utf-8", "replace")
    if reply.status == 200:
        return Outcome("ok", 200, None, "", text)
    code, kind, message = None, None, text[:500]
    try:
        error = json.loads(text).get("error")
        if isinstance(error, dict):
            kind = error.get("type") if isinstance(error.get("type"), str) else None
            code = str(error["code"]) if error.get("code") is not None else kind
            message = str(error.get("message") or message)
        elif isinstance(error, str):
            message = error
    except (ValueError, AttributeError):
        pass
    should_retry = reply.headers.get("x-should-retry")
    decision = decide(
        Family.OPENAI,
        reply.status,
        code,
        message,
        reason=kind,
        where=Where.REQUEST,
        should_retry={"true": True, "false": False}.get(should_retry or ""),
    )
    return Outcome(decision.kind.value, reply.status, decision.stop or code or f"http_{reply.status}", message, text)


def success_row(request_id: str, outcome: Outcome, headers: dict[str, str]) -> tuple[Any, ...]:
    """A RAW_RESULT_SCHEMA row from a 200 body (an unreadable body is a row with an error code)."""
    rid = headers.get("x-request-id")
    try:
        body = json.loads(outcome.payload)
        choice = body["choices"][0]
        message = choice.get("message") or {}
        usage = body.get("usage") or {}
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            content = json.dumps(content)
        refusal = message.get("refusal")
        return (
            request_id,
            200,
            content,
            choice.get("finish_reason"),
            usage.get("prompt_tokens"),
            cached,
            usage.get("completion_tokens"),
            None,
            f"refused: {refusal}" if refusal else None,
            rid,
            outcome.payload,
        )
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        return unparseable_row(request_id, f"the 200 response is not a chat completion: {exc!r}", rid, outcome.payload)


def unparseable_row(request_id: str, message: str, provider_request_id: str | None, payload: str) -> tuple[Any, ...]:
    """A RAW_RESULT_SCHEMA row for a 200 whose body could not be read: ``unparseable_response``, body kept."""
    return (
        request_id,
        200,
        None,
        None,
        None,
        None,
        None,
        "unparseable_response",
        message,
        provider_request_id,
        payload,
    )


def error_row(request_id: str, outcome: Outcome, headers: dict[str, str], secret: str | None) -> tuple[Any, ...]:
    """A RAW_RESULT_SCHEMA row for a request that failed for good (poison, or retries spent)."""
    return (
        request_id,
        outcome.status,
        None,
        None,
        None,
        None,
        None,
        outcome.code,
        redact(outcome.message, secret),
        headers.get("x-request-id"),
        redact(outcome.payload, secret) or None,
    )
