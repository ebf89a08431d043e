"""The ``http_error`` scenario: any HTTP error status and code on the endpoints it names, in each provider's own
envelope on the wire (what the error-table tests make every SDK raise), a given number of times."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from batch_pipeline.sandbox import SandboxAdmin
from batch_pipeline.sandbox.scenarios import make_scenario

SIGV4 = (
    "AWS4-HMAC-SHA256 Credential=AKIDSANDBOX/20260101/us-east-1/bedrock/aws4_request, SignedHeaders=host, Signature=00"
)
CALLS = {  # provider -> (path, headers) of a GET on its list endpoint
    "openai": ("/v1/batches", {"Authorization": "Bearer sk-sandbox"}),
    "anthropic": ("/v1/messages/batches", {"x-api-key": "sk-sandbox", "anthropic-version": "2023-06-01"}),
    "bedrock": ("/model-invocation-jobs", {"Authorization": SIGV4}),
    "gemini": ("/v1beta/batches", {"x-goog-api-key": "sk-sandbox"}),
    "vertex": ("/v1beta1/projects/p/locations/us-central1/batchPredictionJobs", {"Authorization": "Bearer t"}),
}
ENDPOINT = {
    "openai": "list_batches",
    "anthropic": "anthropic_list",
    "bedrock": "bedrock_list",
    "gemini": "gemini_list",
    "vertex": "vertex_list",
}


def get(url: str, provider: str) -> tuple[int, dict[str, str], Any]:
    path, headers = CALLS[provider]
    try:
        with urllib.request.urlopen(urllib.request.Request(url + path, headers=headers), timeout=10) as response:
            return response.status, dict(response.headers), json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, json.loads(exc.read() or b"null")


def test_each_provider_gets_the_error_in_its_own_envelope(sandbox_url: str, admin: SandboxAdmin) -> None:
    admin.set_scenario(
        "http_error", status=429, code="enforced_spend_limit_reached", message="spent", on=list(ENDPOINT.values())
    )
    status, _, body = get(sandbox_url, "anthropic")
    assert status == 429 and body == {
        "type": "error",
        "error": {
            "type": "rate_limit_error",
            "message": "spent",
            "details": {"error_code": "enforced_spend_limit_reached"},
        },
    }
    status, _, body = get(sandbox_url, "openai")
    assert status == 429 and body["error"] == {
        "message": "spent",
        "type": "invalid_request_error",
        "param": None,
        "code": "enforced_spend_limit_reached",
    }

    admin.set_scenario(
        "http_error", status=400, code="ServiceQuotaExceededException", message="full", on=["bedrock_list"]
    )
    status, headers, body = get(sandbox_url, "bedrock")
    assert (
        status == 400 and headers["x-amzn-errortype"] == "ServiceQuotaExceededException" and body == {"message": "full"}
    )

    admin.set_scenario(
        "http_error",
        status=403,
        code="BILLING_DISABLED",
        type="PERMISSION_DENIED",
        message="pay",
        on=["gemini_list", "vertex_list"],
    )
    for provider in ("gemini", "vertex"):
        status, _, body = get(sandbox_url, provider)
        assert status == 403 and body["error"]["status"] == "PERMISSION_DENIED", provider
        assert body["error"]["message"] == "pay" and [d["reason"] for d in body["error"]["details"]] == [
            "BILLING_DISABLED"
        ]


def test_the_defaults_follow_the_status_and_a_wait_is_said_each_providers_way(
    sandbox_url: str, admin: SandboxAdmin
) -> None:
    admin.set_scenario("http_error", status=503, retry_after_ms=1500, on=list(ENDPOINT.values()))
    status, headers, body = get(sandbox_url, "openai")
    assert status == 503 and body["error"]["type"] == "server_error" and body["error"]["code"] is None
    assert headers["retry-after-ms"] == "1500" and headers["retry-after"] == "2"
    assert "sandbox scenario http_error" in body["error"]["message"]
    assert get(sandbox_url, "anthropic")[2]["error"]["type"] == "api_error"
    _, headers, _ = get(sandbox_url, "bedrock")
    assert headers["x-amzn-errortype"] == "ServiceUnavailableException"
    admin.set_scenario("http_error", status=429, retry_after_ms=1500, on=["gemini_list"])
    _, headers, body = get(sandbox_url, "gemini")
    assert body["error"]["status"] == "RESOURCE_EXHAUSTED" and "retry-after" not in headers
    assert {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "1.5s"} in body["error"]["details"]


def test_only_the_named_endpoints_and_only_so_many_times(sandbox_url: str, admin: SandboxAdmin) -> None:
    admin.set_scenario("http_error", status=409, times=2, on=["list_batches"])
    assert [get(sandbox_url, "openai")[0] for _ in range(3)] == [409, 409, 200]
    assert get(sandbox_url, "anthropic")[0] == 200


@pytest.mark.parametrize("status", [200, 302, 600])
def test_the_status_must_be_an_http_error(status: int) -> None:
    with pytest.raises(ValueError, match="400-599"):
        make_scenario("http_error", {"status": status})


def test_the_other_scenarios_answer_as_before(sandbox_url: str, admin: SandboxAdmin) -> None:
    admin.set_scenario("rate_limit", times=1, on=["anthropic_list"])
    status, _, body = get(sandbox_url, "anthropic")
    assert status == 429 and body["error"]["type"] == "rate_limit_error" and "details" not in body["error"]
    admin.set_scenario("server_error", times=1, on=["gemini_list"])
    status, _, body = get(sandbox_url, "gemini")
    assert status == 500 and body["error"]["status"] == "INTERNAL" and "details" not in body["error"]
