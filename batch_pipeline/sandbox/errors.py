"""The OpenAI error envelope and the exception that carries it to the HTTP layer."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An HTTP error answered as ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        """The JSON envelope."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, *, param: str | None = None, code: str | None = None) -> ApiError:
    """400 invalid_request_error."""
    return ApiError(400, message, param=param, code=code)


def not_found(kind: str, object_id: str) -> ApiError:
    """404 for an unknown object id."""
    return ApiError(404, f"No such {kind} object: {object_id}", param="id", code="not_found")


class InjectedError(ApiError):
    """The ``http_error`` scenario's answer, in whatever envelope the endpoint's provider uses: ``type`` and
    ``code`` are given only when the scenario names them (each provider's converter picks its own default for
    the status: ``as_anthropic``, ``as_bedrock``, ``as_google``)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        default = "server_error" if status >= 500 else "invalid_request_error"
        super().__init__(status, message, type=type or default, code=code, headers=headers)
        self.given_type = type
