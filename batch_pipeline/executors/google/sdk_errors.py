"""A ``google-genai`` exception as our error, for the Gemini API and Vertex AI alike (one error table, two families).

Both backends drive the same SDK, so they read its ``APIError`` the same way: the ``google.rpc`` details (whether
the body wraps them in ``error`` or not), the ``ErrorInfo`` reason, and the wait the server asks for, which Google
states in ``RetryInfo`` (a ``retry-after`` header only as a fallback). A lost connection is a transient
``connection_error`` whichever HTTP client the SDK runs on (``httpx2`` when installed, else ``httpx``).
"""

from typing import Any

import httpx2
from google.genai import errors as genai_errors

from batch_pipeline.core.error_table import Family, Where
from batch_pipeline.core.errors import BatchPipelineError
from batch_pipeline.core.ledger.capacity import Dimension
from batch_pipeline.executors.google.format import ERROR_INFO
from batch_pipeline.executors.provider_errors import classified, connection_error, redact, retry_after_s

RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"
TRANSPORT_ERRORS: tuple[type[Exception], ...] = (httpx2.TransportError,)
try:  # google-genai uses httpx2 when it is installed, else httpx
    import httpx

    TRANSPORT_ERRORS += (httpx.TransportError,)
except ImportError:  # pragma: no cover
    pass
SDK_ERRORS: tuple[type[Exception], ...] = (genai_errors.APIError, *TRANSPORT_ERRORS)


def error_details(body: Any) -> list[dict[str, Any]]:
    """The ``google.rpc`` detail objects of an error body (``{"error": {"details": [...]}}`` or the bare error)."""
    error = body.get("error", body) if isinstance(body, dict) else {}
    found = error.get("details") if isinstance(error, dict) else None
    return [d for d in found or [] if isinstance(d, dict)]


def retry_delay_s(body: Any) -> float | None:
    """The wait an error body states in its ``google.rpc.RetryInfo`` detail (``"retryDelay": "1.5s"``)."""
    for detail in error_details(body):
        delay = detail.get("retryDelay") if detail.get("@type") == RETRY_INFO else None
        if isinstance(delay, str) and delay.endswith("s"):
            try:
                return max(0.0, float(delay[:-1]))
            except ValueError:
                return None
    return None


def requested_wait_s(exc: genai_errors.APIError) -> float | None:
    """What the server asks us to wait: ``RetryInfo``, else a ``retry-after`` header; None when it says nothing."""
    stated = retry_delay_s(exc.details)
    if stated is not None:
        return stated
    headers = getattr(exc.response, "headers", None) if exc.response is not None else None
    return retry_after_s({k.lower(): v for k, v in headers.items()}) if headers is not None else None


def error_reason(exc: genai_errors.APIError) -> str | None:
    """The ``ErrorInfo`` reason (a second code, e.g. ``API_KEY_INVALID``), if the error carries one."""
    reason = next((d.get("reason") for d in error_details(exc.details) if d.get("@type") == ERROR_INFO), None)
    return reason if isinstance(reason, str) else None


def translate_sdk_error(
    exc: Exception,
    family: Family,
    provider: str,
    action: str,
    secret: str | None = None,
    *,
    where: Where = Where.CALL,
    dimension: Dimension | None = None,
) -> BatchPipelineError:
    """SDK exception -> our error class, by the one error table; secrets redacted. ``where=CREATE`` (with the
    ``dimension`` it fills) for the call that creates a batch."""
    if isinstance(exc, genai_errors.APIError):
        status = exc.status or ""
        return classified(
            family,
            provider,
            action,
            exc.code or 0,
            status.lower() or None,
            exc.message or str(exc.details or ""),
            shown=status,
            reason=error_reason(exc),
            retry_after=requested_wait_s(exc),
            where=where,
            dimension=dimension,
            secret=secret,
        )
    if isinstance(exc, TRANSPORT_ERRORS):
        return connection_error(family, provider, action, exc, where=where, dimension=dimension, secret=secret)
    return BatchPipelineError(redact(f"{provider} {action} failed: {type(exc).__name__}: {exc}", secret))
