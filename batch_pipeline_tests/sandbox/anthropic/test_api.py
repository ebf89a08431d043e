"""The Anthropic Message Batches API of the sandbox, driven by the real anthropic SDK (and raw HTTP)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import anthropic
import pytest

from batch_pipeline.sandbox import SandboxAdmin, SandboxServer
from batch_pipeline.sandbox.anthropic import api as anthropic_api
from batch_pipeline.sandbox.anthropic import create_body

MODEL = "claude-sonnet-4-5"
COUNT_KEYS = {"processing", "succeeded", "errored", "canceled", "expired"}


def request(custom_id: str, text: str, *, model: str = MODEL, max_tokens: int = 64, **params: Any) -> dict[str, Any]:
    """One batch request entry."""
    return {
        "custom_id": custom_id,
        "params": {"model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": text}], **params},
    }


def create(client: anthropic.Anthropic, requests: list[dict[str, Any]]) -> dict[str, Any]:
    """Create a batch; returns the raw MessageBatch JSON."""
    raw_response = client.messages.batches.with_raw_response.create(requests=requests)  # type: ignore[arg-type]
    return json.loads(raw_response.text())


def retrieve(client: anthropic.Anthropic, batch_id: str) -> dict[str, Any]:
    """The raw MessageBatch JSON."""
    return json.loads(client.messages.batches.with_raw_response.retrieve(batch_id).text())


def wait_ended(client: anthropic.Anthropic, batch_id: str, timeout: float = 60.0) -> dict[str, Any]:
    """Poll until processing_status is ended."""
    deadline = time.monotonic() + timeout
    while True:
        batch = retrieve(client, batch_id)
        if batch["processing_status"] == "ended":
            return batch
        assert time.monotonic() < deadline, f"batch {batch_id} stuck in {batch['processing_status']}"
        time.sleep(0.02)


def results(client: anthropic.Anthropic, batch_id: str) -> list[dict[str, Any]]:
    """The result lines, through the SDK, as plain dicts."""
    return [line.model_dump(mode="json", exclude_none=True) for line in client.messages.batches.results(batch_id)]


def raw(
    url: str, method: str = "GET", headers: dict[str, str] | None = None, body: bytes | None = None
) -> tuple[int, dict[str, str], bytes]:
    """A raw HTTP call: (status, headers, body), errors included."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


def test_lifecycle_counts_and_results_url(aclient: anthropic.Anthropic, admin: SandboxAdmin, sandbox_url: str) -> None:
    admin.clock(freeze=True)
    reqs = [request(f"lc-{i}", f"item {i}") for i in range(6)]
    created = create(aclient, reqs)
    assert created["id"].startswith("msgbatch_") and created["type"] == "message_batch"
    assert created["processing_status"] == "in_progress" and created["results_url"] is None
    assert set(created["request_counts"]) == COUNT_KEYS
    assert created["request_counts"]["processing"] == 6
    assert created["ended_at"] is None and created["cancel_initiated_at"] is None and created["archived_at"] is None
    assert created["created_at"].endswith("Z")
    batch = aclient.messages.batches.retrieve(created["id"])
    assert batch.expires_at - batch.created_at == timedelta(hours=24)

    admin.clock(advance_s=0.15)  # half of the requests are done, but counts stay at processing until the end
    midway = retrieve(aclient, created["id"])
    assert midway["processing_status"] == "in_progress" and midway["results_url"] is None
    assert midway["request_counts"] == {"processing": 6, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
    with pytest.raises(anthropic.AnthropicError, match="results_url"):
        aclient.messages.batches.results(created["id"])

    admin.clock(advance_s=1.0)
    ended = retrieve(aclient, created["id"])
    assert ended["processing_status"] == "ended" and ended["ended_at"] is not None
    assert ended["request_counts"] == {"processing": 0, "succeeded": 6, "errored": 0, "canceled": 0, "expired": 0}
    assert ended["results_url"] == f"{sandbox_url}/v1/messages/batches/{created['id']}/results"
    lines = results(aclient, created["id"])
    ids = [line["custom_id"] for line in lines]
    assert sorted(ids) == sorted(r["custom_id"] for r in reqs) and ids != [r["custom_id"] for r in reqs]
    for line in lines:
        message = line["result"]["message"]
        assert line["result"]["type"] == "succeeded" and message["type"] == "message"
        assert message["role"] == "assistant" and message["model"] == MODEL
        assert message["stop_reason"] == "end_turn" and message["content"][0]["text"].startswith("Sandbox reply")
        usage = message["usage"]
        assert usage["service_tier"] == "batch" and usage["input_tokens"] > 0 and usage["output_tokens"] > 0
        assert usage["cache_creation_input_tokens"] == usage["cache_read_input_tokens"] == 0


def test_results_url_follows_the_host_header_and_errors_use_the_envelope(
    aclient: anthropic.Anthropic, admin: SandboxAdmin, sandbox_url: str
) -> None:
    batch_id = create(aclient, [request("h1", "hello")])["id"]
    port = urlsplit(sandbox_url).port
    headers = {"x-api-key": "sk-sandbox", "anthropic-version": "2023-06-01", "Host": f"localhost:{port}"}
    status, got, body = raw(f"{sandbox_url}/v1/messages/batches/{batch_id}/results", headers=headers)
    assert status == 400 and got["request-id"]
    assert json.loads(body) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": json.loads(body)["error"]["message"]},
    }
    wait_ended(aclient, batch_id)
    status, got, body = raw(f"{sandbox_url}/v1/messages/batches/{batch_id}", headers=headers)
    assert status == 200 and got["request-id"]
    url = json.loads(body)["results_url"]
    assert url == f"http://localhost:{port}/v1/messages/batches/{batch_id}/results"
    status, _, body = raw(url, headers=headers)
    assert status == 200 and json.loads(body.splitlines()[0])["custom_id"] == "h1"


def test_list_pages_newest_first_with_after_and_before(aclient: anthropic.Anthropic, admin: SandboxAdmin) -> None:
    ids = [create(aclient, [request(f"p{i}", "x")])["id"] for i in range(5)]
    newest = list(reversed(ids))
    first = aclient.messages.batches.list(limit=2)
    assert [b.id for b in first.data] == newest[:2] and first.has_more
    assert first.first_id == newest[0] and first.last_id == newest[1]
    second = aclient.messages.batches.list(limit=2, after_id=first.last_id)
    assert [b.id for b in second.data] == newest[2:4] and second.has_more
    last = aclient.messages.batches.list(limit=2, after_id=second.last_id)
    assert [b.id for b in last.data] == newest[4:] and not last.has_more
    back = aclient.messages.batches.list(limit=2, before_id=second.first_id)
    assert [b.id for b in back.data] == newest[:2] and not back.has_more
    back1 = aclient.messages.batches.list(limit=1, before_id=newest[2])
    assert [b.id for b in back1.data] == [newest[1]] and back1.has_more
    assert [b.id for b in aclient.messages.batches.list(limit=2)] == newest  # the SDK's auto-pagination
    assert len(aclient.messages.batches.list().data) == 5  # default limit 20
    for bad in ({"limit": 0}, {"limit": 1001}, {"after_id": "msgbatch_nope"}):
        with pytest.raises(anthropic.BadRequestError):
            aclient.messages.batches.list(**bad)  # type: ignore[arg-type]


def test_delete_only_after_the_batch_ended(aclient: anthropic.Anthropic, admin: SandboxAdmin) -> None:
    admin.clock(freeze=True)
    batch_id = create(aclient, [request("d1", "x")])["id"]
    with pytest.raises(anthropic.BadRequestError) as early:
        aclient.messages.batches.delete(batch_id)
    assert early.value.type == "invalid_request_error"
    admin.clock(advance_s=1.0)
    deleted = aclient.messages.batches.delete(batch_id)
    assert deleted.id == batch_id and deleted.type == "message_batch_deleted"
    with pytest.raises(anthropic.NotFoundError) as gone:
        aclient.messages.batches.retrieve(batch_id)
    assert gone.value.type == "not_found_error" and gone.value.request_id
    assert aclient.messages.batches.list().data == []


def test_cancel_keeps_finished_requests_and_cancels_the_rest(aclient: anthropic.Anthropic, admin: SandboxAdmin) -> None:
    admin.set_scenario("slow", in_progress_s=100)
    admin.clock(freeze=True)
    batch_id = create(aclient, [request(f"c{i}", f"item {i}") for i in range(10)])["id"]
    admin.clock(advance_s=50.05)
    canceling = aclient.messages.batches.cancel(batch_id)
    assert canceling.processing_status == "canceling" and canceling.cancel_initiated_at is not None
    assert canceling.request_counts.processing == 10 and canceling.results_url is None
    admin.clock(advance_s=10.0)  # progress stops while canceling
    ended = retrieve(aclient, batch_id)
    assert ended["processing_status"] == "ended"
    assert ended["request_counts"] == {"processing": 0, "succeeded": 5, "errored": 0, "canceled": 5, "expired": 0}
    kinds = [line["result"]["type"] for line in results(aclient, batch_id)]
    assert sorted(kinds) == ["canceled"] * 5 + ["succeeded"] * 5
    ledger = admin.ledger()
    assert len(ledger) == 5 and {e["provider"] for e in ledger} == {"anthropic"}
    with pytest.raises(anthropic.BadRequestError):  # 400, not 409 (which the SDK would retry)
        aclient.messages.batches.cancel(batch_id)


def test_both_auth_headers_are_accepted_and_bad_keys_refused(
    aclient: anthropic.Anthropic, admin: SandboxAdmin, sandbox_url: str
) -> None:
    url = sandbox_url + "/v1/messages/batches"
    body = json.dumps({"requests": [request("a1", "x")]}).encode()
    api_key = {"x-api-key": "sk-old-sdk", "anthropic-version": "2023-06-01", "content-type": "application/json"}
    status, headers, payload = raw(url, "POST", api_key, body)
    assert status == 200 and headers["request-id"] and json.loads(payload)["type"] == "message_batch"
    bearer = {"authorization": "Bearer sk-new-sdk", "anthropic-version": "2026-10-21"}
    assert raw(url, headers=bearer)[0] == 200
    assert aclient.messages.batches.list().data  # the SDK itself sends Authorization: Bearer

    status, headers, payload = raw(url, headers={"anthropic-version": "2023-06-01"})
    assert status == 401 and json.loads(payload)["error"]["type"] == "authentication_error"
    status, _, payload = raw(url, headers={"x-api-key": "k"})
    assert status == 400 and "anthropic-version" in json.loads(payload)["error"]["message"]
    bad = anthropic.Anthropic(base_url=sandbox_url, api_key="sk-sandbox-bad", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as caught:
        bad.messages.batches.list()
    assert caught.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "invalid x-api-key"},
    }
    assert caught.value.request_id
    status, _, payload = raw(sandbox_url + "/v1/messages/nothing", headers=bearer)
    assert status == 404 and json.loads(payload)["error"]["type"] == "not_found_error"


def test_create_validates_requests(aclient: anthropic.Anthropic, admin: SandboxAdmin, sandbox_url: str) -> None:
    bad_batches = [
        [],
        [request("x" * 65, "too long an id")],
        [request("bad id!", "illegal characters")],
        [request("dup", "a"), request("dup", "b")],
        [request("zero", "x", max_tokens=0)],
        [{"custom_id": "nop"}],
        [{"custom_id": "nomsg", "params": {"model": MODEL, "max_tokens": 5, "messages": []}}],
    ]
    for reqs in bad_batches:
        with pytest.raises(anthropic.BadRequestError) as caught:
            aclient.messages.batches.create(requests=reqs)  # type: ignore[arg-type]
        assert caught.value.type == "invalid_request_error"
    too_many = json.dumps({"requests": [request(f"n{i}", "x") for i in range(100_001)]}).encode()
    headers = {"x-api-key": "k", "anthropic-version": "2023-06-01", "content-type": "application/json"}
    status, _, payload = raw(sandbox_url + "/v1/messages/batches", "POST", headers, too_many)
    assert status == 400 and "100000" in json.loads(payload)["error"]["message"]
    assert create(aclient, [request("x" * 64, "the longest id is fine")])["request_counts"]["processing"] == 1
    assert len(aclient.messages.batches.list().data) == 1


def test_create_rejects_bodies_over_256_mb(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    body = json.dumps({"requests": [request("big", "y" * 2000)]}).encode()
    assert len(create_body.parse_create(body, tmp_path / "big.requests").lines) == 1
    monkeypatch.setattr(create_body, "MAX_BYTES", 1000)  # the limit itself, scaled down
    with pytest.raises(anthropic_api.AnthropicError) as caught:
        create_body.parse_create(body, tmp_path / "big.requests")
    assert caught.value.status == 413 and caught.value.body()["error"]["type"] == "request_too_large"


def test_batches_survive_a_restart_with_a_state_dir(tmp_path: Any) -> None:
    with SandboxServer(port=0, state_dir=str(tmp_path)) as first:
        sdk = anthropic.Anthropic(base_url=first.url, api_key="k", max_retries=0)
        batch_id = create(sdk, [request("keep", "x")])["id"]
        wait_ended(sdk, batch_id)
        ledger = SandboxAdmin(first.url).ledger()
    with SandboxServer(port=0, state_dir=str(tmp_path)) as second:
        sdk = anthropic.Anthropic(base_url=second.url, api_key="k", max_retries=0)
        assert retrieve(sdk, batch_id)["request_counts"]["succeeded"] == 1
        assert [line["custom_id"] for line in results(sdk, batch_id)] == ["keep"]
        assert SandboxAdmin(second.url).ledger() == ledger  # restored, not billed again
