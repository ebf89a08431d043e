"""Pieces shared by the backends' error translation: secrets out of messages, the provider's requested wait, and
``classified``: an SDK exception's status, code and message put to the one error table (``core/error_table.py``)."""

import email.utils
import random
import re
import time
from collections.abc import Mapping

from batch_pipeline.core.error_table import Family, Where, decide
from batch_pipeline.core.errors import BatchPipelineError, provider_error
from batch_pipeline.core.ledger.capacity import Dimension, stated_limit

_KEY_LIKE = re.compile(r"\b(sk|key)-[A-Za-z0-9_\-*]{4,}")


def redact(text: str, secret: str | None = None) -> str:
    """Remove the API key (and anything shaped like one) from text that may be logged or stored."""
    if secret:
        text = text.replace(secret, "***")
    return _KEY_LIKE.sub(lambda m: m.group(1) + "-***", text)


def retry_after_s(headers: Mapping[str, str] | None) -> float | None:
    """``retry-after-ms``, else ``retry-after`` (seconds or an HTTP date), in seconds; None when absent."""
    if not headers:
        return None
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time()) if when is not None else None


MAX_RETRY_WAIT_S = 60.0


def retry_wait_s(attempt: int, asked_s: float | None, cap_s: float = MAX_RETRY_WAIT_S) -> float:
    """How long to wait before retry ``attempt`` (0-based): what the provider asked for (Retry-After, Google's
    RetryInfo), else jittered exponential backoff from 0.5 s up to 8 s; never above ``cap_s``."""
    wait = asked_s if asked_s is not None else min(0.5 * 2**attempt, 8.0) * (1 - 0.25 * random.random())
    return min(wait, cap_s)


def classified(
    family: Family,
    provider: str,
    action: str,
    status: int | None,
    code: str | None,
    detail: str,
    *,
    shown: str | None = None,
    reason: str | None = None,
    retry_after: float | None = None,
    where: Where = Where.CALL,
    dimension: Dimension | None = None,
    secret: str | None = None,
) -> BatchPipelineError:
    """What the one error table (``core/error_table.py``) makes of a provider's answer, as the exception to raise.

    The adapter gives what its SDK's exception carries: the HTTP status (None: no answer), the provider's code
    (``reason``: a second one, Google's ErrorInfo reason or Anthropic's ``details.error_code``), the message and
    the requested wait. The message reads ``"<provider> <action> failed: HTTP <status> <shown>: <detail>"``
    (``shown`` defaults to the code), secrets redacted, and a stop ends with the row's advice; ``where`` is
    ``CREATE`` for the call that creates a batch, whose refusal for the account's queue is a ``QuotaError`` for
    ``dimension``."""
    label = code if shown is None else shown
    head = (f"HTTP {status} {label or ''}".rstrip() + ": ") if status is not None else ""
    message = redact(f"{provider} {action} failed: {head}{detail}", secret)
    if not detail:
        message = message.rstrip(": ")
    decision = decide(family, status, code, detail, reason=reason, where=where)
    return provider_error(
        decision,
        message,
        code=code,
        retry_after_s=retry_after,
        dimension=dimension.value if dimension is not None else None,
        limit=stated_limit(message),
    )


def connection_error(
    family: Family,
    provider: str,
    action: str,
    exc: Exception,
    *,
    where: Where = Where.CALL,
    dimension: Dimension | None = None,
    secret: str | None = None,
) -> BatchPipelineError:
    """``classified`` for a call that got no answer (connection lost, timed out): the table's
    ``connection_error`` row, the SDK's exception named in the message."""
    return classified(
        family,
        provider,
        action,
        None,
        "connection_error",
        f"{type(exc).__name__}: {exc}",
        where=where,
        dimension=dimension,
        secret=secret,
    )
