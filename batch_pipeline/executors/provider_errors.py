"""Pieces shared by the backends' error translation: secrets out of messages, the provider's requested wait,
(the systemic error codes are one table in ``core/errors.py``: ``SYSTEMIC_CODES``)."""

import email.utils
import random
import re
import time
from collections.abc import Mapping

from batch_pipeline.core.errors import BatchPipelineError, QuotaError, TransientError
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


# What a create refused for the account's queue says (as opposed to a plain rate limit, which is retried in place):
# OpenAI "Enqueued token limit ... Limit: N", Anthropic "... processing queue ...", Google RESOURCE_EXHAUSTED
# "... quota ...", Bedrock ServiceQuotaExceededException.
_QUEUE_WORDS = re.compile(r"enqueued|queue|per hour|concurrent|quota|limit:", re.IGNORECASE)
QUOTA_CODES = frozenset({"ServiceQuotaExceededException", "token_limit_exceeded"})


def queue_refusal(error: BatchPipelineError, status: int | None, dimension: Dimension) -> QuotaError | None:
    """The create was refused because the account's queue is full (a ``QuotaError`` for ``dimension``: the
    runner records it, learns the limit and lets the shard wait), or None (handle ``error`` as it is)."""
    if isinstance(error, QuotaError):
        return error
    if not isinstance(error, TransientError):
        return None
    message = str(error)
    if error.code in QUOTA_CODES or (status == 429 and _QUEUE_WORDS.search(message)):
        return QuotaError(message, dimension=dimension.value, limit=stated_limit(message), code=error.code,
                          retry_after_s=error.retry_after_s)
    return None
