"""Bedrock's rest-json error shape: the type in ``x-amzn-ErrorType``, the body ``{"message": ...}``.

botocore reads the code from that header (or the body's ``__type``), so ``ClientError.response["Error"]["Code"]``
is e.g. ``ValidationException`` and the SDK's own retries see ``ThrottlingException`` as a throttle.
"""

from __future__ import annotations

from typing import Any

from batch_pipeline.sandbox.errors import ApiError, InjectedError

STATUS_TYPES = {
    400: "ValidationException",
    403: "AccessDeniedException",
    404: "ResourceNotFoundException",
    405: "UnknownOperationException",
    409: "ConflictException",
    413: "ValidationException",
    429: "ThrottlingException",
    500: "InternalServerException",
    503: "ServiceUnavailableException",
}


class BedrockError(ApiError):
    """An error answered in Bedrock's shape (``type`` is the exception name)."""

    def __init__(
        self, status: int, message: str, *, type: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        name = type or STATUS_TYPES.get(status, "InternalServerException")
        super().__init__(status, message, type=name, headers={**(headers or {}), "x-amzn-ErrorType": name})

    def body(self) -> dict[str, Any]:
        return {"message": self.message}


def injected_type(status: int) -> str:
    """The exception a status is named by (a client error the service model does not list is a validation)."""
    return STATUS_TYPES.get(status, "ValidationException" if status < 500 else "InternalServerException")


def validation(message: str) -> BedrockError:
    return BedrockError(400, message, type="ValidationException")


def as_bedrock(exc: ApiError) -> BedrockError:
    """The same error in Bedrock's shape (headers such as ``retry-after`` are kept)."""
    if isinstance(exc, BedrockError):
        return exc
    if isinstance(exc, InjectedError):  # the http_error scenario: its code is the exception's name
        return BedrockError(exc.status, exc.message, type=exc.code or injected_type(exc.status), headers=exc.headers)
    message = exc.message
    if exc.status == 429:
        message = "Too many requests, please wait before trying again. (" + exc.message + ")"
    return BedrockError(exc.status, message, headers=exc.headers)
