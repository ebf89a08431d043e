"""Google's error envelope: ``{"error": {"code", "message", "status", "details"}}`` (a ``google.rpc.Status``)."""

from __future__ import annotations

from typing import Any

from batch_pipeline.sandbox.errors import ApiError, InjectedError

# HTTP status -> canonical google.rpc.Code name
STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "INVALID_ARGUMENT",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"
RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"
DOMAIN = "googleapis.com"


class GoogleError(ApiError):
    """An HTTP error answered in Google's envelope; ``details`` are google.rpc detail objects."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        details: list[dict[str, Any]] | None = None,
        headers: dict[str, str] | None = None,
        status_name: str | None = None,
    ) -> None:
        super().__init__(status, message, type=status_name or STATUS_NAMES.get(status, "UNKNOWN"), headers=headers)
        self.details = list(details or [])

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.status, "message": self.message, "status": self.type}
        if self.details:
            error["details"] = self.details
        return {"error": error}


def error_info(reason: str, **metadata: str) -> dict[str, Any]:
    """A ``google.rpc.ErrorInfo`` detail (``reason`` is what a client matches on)."""
    return {"@type": ERROR_INFO, "reason": reason, "domain": DOMAIN, "metadata": dict(metadata)}


# HTTP status -> google.rpc.Code number (what a google.rpc.Status carries in ``code``)
RPC_CODES = {400: 3, 401: 16, 403: 7, 404: 5, 409: 10, 429: 8, 499: 1, 500: 13, 501: 12, 503: 14, 504: 4}


def status_object(status: int, message: str, details: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A ``google.rpc.Status`` as a result line or an operation carries it: ``code`` is the RPC code (3, 13 ...),
    not the HTTP status, and there is no ``status`` name (that is only in the HTTP error envelope)."""
    body: dict[str, Any] = {"code": RPC_CODES.get(status, 2), "message": message}
    if details:
        body["details"] = details
    return body


def as_google(exc: ApiError) -> GoogleError:
    """The same error in Google's envelope. A 429 gets a ``RetryInfo`` detail with the delay its
    ``retry-after-ms`` header asks for (Google states the wait there, not in a header)."""
    if isinstance(exc, GoogleError):
        return exc
    details: list[dict[str, Any]] = []
    if isinstance(exc, InjectedError) and exc.code:  # the http_error scenario: its ErrorInfo reason, status name
        details.append(error_info(exc.code))
    millis = exc.headers.get("retry-after-ms")
    if exc.status == 429 and millis:
        details.append({"@type": RETRY_INFO, "retryDelay": f"{int(millis) / 1000:g}s"})
    headers = {k: v for k, v in exc.headers.items() if k not in ("retry-after-ms", "retry-after")}
    return GoogleError(
        exc.status,
        exc.message,
        details=details,
        headers=headers,
        status_name=exc.given_type if isinstance(exc, InjectedError) else None,
    )
