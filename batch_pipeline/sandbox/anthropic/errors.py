"""The Anthropic error envelope: ``{"type": "error", "error": {"type", "message"}}``."""

from __future__ import annotations

from typing import Any

from batch_pipeline.sandbox.errors import ApiError

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
    """An HTTP error answered in the Anthropic envelope (the ``type`` is the Anthropic error type)."""

    def body(self) -> dict[str, Any]:
        """``{"type": "error", "error": {"type", "message"}}``."""
        return {"type": "error", "error": {"type": self.type, "message": self.message}}


def anthropic_error(status: int, message: str, *, headers: dict[str, str] | None = None) -> AnthropicError:
    """An error whose type follows from its HTTP status."""
    return AnthropicError(status, message, type=STATUS_TYPES.get(status, "api_error"), headers=headers)


def invalid_request(message: str) -> AnthropicError:
    """400 invalid_request_error."""
    return anthropic_error(400, message)


def as_anthropic(exc: ApiError) -> AnthropicError:
    """The same error in the Anthropic envelope (headers such as ``retry-after-ms`` are kept)."""
    if isinstance(exc, AnthropicError):
        return exc
    return anthropic_error(exc.status, exc.message, headers=exc.headers)
