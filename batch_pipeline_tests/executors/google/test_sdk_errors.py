"""The google-genai error reading both Google backends share (executors/google/sdk_errors.py): a lost connection is
transient whichever HTTP client the SDK runs on, and the wait Google asks for is read from RetryInfo first."""

import httpx
import httpx2
import pytest
from google.genai import errors as genai_errors

from batch_pipeline.core.error_table import Family, Where
from batch_pipeline.core.errors import QuotaError, TransientError
from batch_pipeline.core.ledger.capacity import Dimension
from batch_pipeline.executors.google.sdk_errors import (
    RETRY_INFO,
    TRANSPORT_ERRORS,
    error_details,
    requested_wait_s,
    retry_delay_s,
    translate_sdk_error,
)


def api_error(
    code: int, status: str, details: list[dict], headers: dict[str, str] | None = None, message: str = "slow down"
):
    body = {"error": {"code": code, "status": status, "message": message, "details": details}}
    response = httpx.Response(code, headers=headers or {}, json=body)
    return genai_errors.APIError(code, body, response)


@pytest.mark.parametrize("family", [Family.GEMINI, Family.VERTEX])
@pytest.mark.parametrize("exc", [httpx.ConnectError("refused"), httpx2.ConnectError("refused")])
def test_a_lost_connection_is_transient_on_either_http_client_for_both_backends(family, exc):
    assert isinstance(exc, TRANSPORT_ERRORS)
    error = translate_sdk_error(exc, family, "Provider", "batch get", "secret")
    assert isinstance(error, TransientError) and "ConnectError" in str(error)


def test_the_wait_is_retry_info_first_then_a_retry_after_header():
    stated = api_error(429, "RESOURCE_EXHAUSTED", [{"@type": RETRY_INFO, "retryDelay": "1.5s"}], {"retry-after": "9"})
    assert requested_wait_s(stated) == 1.5
    assert requested_wait_s(api_error(429, "RESOURCE_EXHAUSTED", [], {"Retry-After": "9"})) == 9.0
    assert requested_wait_s(api_error(429, "RESOURCE_EXHAUSTED", [])) is None
    bare = {"details": [{"@type": RETRY_INFO, "retryDelay": "2s"}]}  # the error object without its envelope
    assert retry_delay_s(bare) == 2.0 and error_details({"error": bare}) == bare["details"]
    assert retry_delay_s({"error": {}}) is None and retry_delay_s(None) is None


def test_a_create_refused_for_the_queue_is_a_quota_error_with_its_wait():
    said = "Enqueued token limit reached for gemini-2.5-flash."  # what the API says (and the sandbox)
    exc = api_error(429, "RESOURCE_EXHAUSTED", [{"@type": RETRY_INFO, "retryDelay": "3s"}], message=said)
    error = translate_sdk_error(
        exc, Family.GEMINI, "Gemini", "batch create", where=Where.CREATE, dimension=Dimension.TOKENS
    )
    assert isinstance(error, QuotaError) and error.retry_after_s == 3.0
