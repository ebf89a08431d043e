"""The Anthropic error envelope: ``{"type": "error", "error": {"type", "message"}}``."""

from __future__ import annotations

from typing import Any

from batch_pipeline.sandbox.errors import ApiError, InjectedError

# HTTP status -> Anthropic error type, for errors raised by shared code (routing, JSON parsing, faults).
STATUS_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}


class AnthropicError(ApiError):
    """An HTTP error answered in the Anthropic envelope (the ``type`` is the Anthropic error type; ``error_code``,
    when given, rides in ``error.details.error_code``, where the SDK picks its error class by)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
        error_code: str | None = None,
    ) -> None:
        super().__init__(status, message, type=type, headers=headers)
        self.error_code = error_code

    def body(self) -> dict[str, Any]:
        """``{"type": "error", "error": {"type", "message"[, "details": {"error_code"}]}}``."""
        error: dict[str, Any] = {"type": self.type, "message": self.message}
        if self.error_code:
            error["details"] = {"error_code": self.error_code}
        return {"type": "error", "error": error}


def anthropic_error(status: int, message: str, *, headers: dict[str, str] | None = None) -> AnthropicError:
    """An error whose type follows from its HTTP status."""
    return AnthropicError(status, message, type=STATUS_TYPES.get(status, "api_error"), headers=headers)


def injected_type(status: int) -> str:
    """The error type of a status, as the docs give it: ``invalid_request_error`` for a 4xx they do not list."""
    return STATUS_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")


def invalid_request(message: str) -> AnthropicError:
    """400 invalid_request_error."""
    return anthropic_error(400, message)


def as_anthropic(exc: ApiError) -> AnthropicError:
    """The same error in the Anthropic envelope (headers such as ``retry-after-ms`` are kept)."""
    if isinstance(exc, AnthropicError):
        return exc
    if isinstance(exc, InjectedError):  # the http_error scenario: its type (else the status's) and error code
        return AnthropicError(
            exc.status,
            exc.message,
            type=exc.given_type or injected_type(exc.status),
            headers=exc.headers,
            error_code=exc.code,
        )
    return anthropic_error(exc.status, exc.message, headers=exc.headers)
