"""Scenarios and failure modes: line errors, expiry, cancel, 429/500, bad keys, validation failures."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections import Counter

import openai
import pytest

from batch_pipeline.sandbox import SandboxAdmin

from .support import chat_line, read_jsonl, retrieve, submit, upload, wait_for

LINE_ERRORS = {"sandbox_scenario": "line_errors", "sandbox_param_rate": "0.5"}


def test_line_errors_fail_once_then_succeed_on_the_next_batch(client: openai.OpenAI, admin: SandboxAdmin) -> None:
    lines = [chat_line(f"le-{i}", f"item {i}") for i in range(20)]
    first = wait_for(client, submit(client, lines, metadata=LINE_ERRORS)["id"])
    assert first["status"] == "completed"
    errors = read_jsonl(client, first["error_file_id"])
    failed_ids = {e["custom_id"] for e in errors}
    assert 0 < len(failed_ids) < 20
    assert first["request_counts"] == {"total": 20, "completed": 20 - len(failed_ids), "failed": len(failed_ids)}
    for error in errors:
        assert error["response"]["status_code"] == 500
        assert error["response"]["body"]["error"]["type"] == "server_error"

    retry_lines = [line for line in lines if line["custom_id"] in failed_ids]
    second = wait_for(client, submit(client, retry_lines, metadata=LINE_ERRORS)["id"])
    assert second["request_counts"] == {"total": len(failed_ids), "completed": len(failed_ids), "failed": 0}
    assert second["error_file_id"] is None

    billed = Counter(e["custom_id"] for e in admin.ledger())
    assert set(billed) == {line["custom_id"] for line in lines}
    assert set(billed.values()) == {1}


def test_expiry_via_the_clock_keeps_partial_results(client: openai.OpenAI, admin: SandboxAdmin) -> None:
    admin.clock(freeze=True)
    lines = [chat_line(f"ex-{i}", f"item {i}") for i in range(10)]
    metadata = {"sandbox_scenario": "slow", "sandbox_params": json.dumps({"in_progress_s": 48 * 3600})}
    batch = submit(client, lines, metadata=metadata)
    admin.clock(advance_s=1.0)
    assert retrieve(client, batch["id"])["status"] == "in_progress"
    admin.clock(advance_s=24 * 3600)
    expired = retrieve(client, batch["id"])
    assert expired["status"] == "expired"
    assert expired["expired_at"] == expired["expires_at"]
    done = expired["request_counts"]["completed"]
    assert done == 4  # floor(10 * (24 h - 0.05 s) / 48 h)
    assert expired["request_counts"] == {"total": 10, "completed": 4, "failed": 6}

    output = read_jsonl(client, expired["output_file_id"])
    errors = read_jsonl(client, expired["error_file_id"])
    assert len(output) == done and all(ln["response"]["status_code"] == 200 for ln in output)
    assert {e["error"]["code"] for e in errors} == {"batch_expired"}
    assert all(e["response"] is None for e in errors)
    assert sorted(ln["custom_id"] for ln in output + errors) == sorted(ln["custom_id"] for ln in lines)
    assert sorted(e["custom_id"] for e in admin.ledger()) == sorted(ln["custom_id"] for ln in output)


def test_expire_scenario_keeps_the_complete_share(client: openai.OpenAI, admin: SandboxAdmin) -> None:
    admin.set_scenario("expire", complete_share=0.3)
    batch = wait_for(client, submit(client, [chat_line(f"s{i}", f"x {i}") for i in range(10)])["id"])
    assert batch["status"] == "expired"
    assert batch["request_counts"] == {"total": 10, "completed": 3, "failed": 7}
    assert len(read_jsonl(client, batch["error_file_id"])) == 7
    assert len(admin.ledger()) == 3


def test_cancel_keeps_partial_results(client: openai.OpenAI, admin: SandboxAdmin) -> None:
    admin.clock(freeze=True)
    lines = [chat_line(f"ca-{i}", f"item {i}") for i in range(10)]
    batch = submit(client, lines, metadata={"sandbox_scenario": "slow", "sandbox_param_in_progress_s": "100"})
    admin.clock(advance_s=50.05)
    cancelling = json.loads(client.batches.with_raw_response.cancel(batch["id"]).text)
    assert cancelling["status"] == "cancelling" and cancelling["cancelling_at"] is not None
    assert cancelling["request_counts"]["completed"] == 5
    admin.clock(advance_s=10.0)  # progress stops while cancelling
    cancelled = retrieve(client, batch["id"])
    assert cancelled["status"] == "cancelled"
    assert cancelled["request_counts"] == {"total": 10, "completed": 5, "failed": 5}
    output = read_jsonl(client, cancelled["output_file_id"])
    errors = read_jsonl(client, cancelled["error_file_id"])
    assert len(output) == 5
    assert [e["error"]["code"] for e in errors] == ["batch_cancelled"] * 5
    assert len(admin.ledger()) == 5
    with pytest.raises(openai.BadRequestError):  # 400, not 409 (which the SDK would retry)
        client.batches.cancel(batch["id"])


def _retrieve_log(admin: SandboxAdmin, path: str) -> list[dict]:
    return [r for r in admin.requests() if r["path"] == path]


def test_rate_limit_retry_after_is_honoured(client: openai.OpenAI, sandbox_url: str, admin: SandboxAdmin) -> None:
    batch = submit(client, [chat_line("rl", "hi")])
    # 600 ms: longer than the SDK's own first backoff (<= 0.5 s), so honouring the header is visible
    admin.set_scenario("rate_limit", times=3, retry_after_ms=600, on=["retrieve_batch"])
    path = f"/v1/batches/{batch['id']}"

    request = urllib.request.Request(sandbox_url + path, headers={"Authorization": "Bearer sk-sandbox"})
    with pytest.raises(urllib.error.HTTPError) as raw:
        urllib.request.urlopen(request, timeout=5)
    assert raw.value.code == 429
    assert raw.value.headers["retry-after-ms"] == "600" and raw.value.headers["retry-after"] == "1"
    assert raw.value.headers["x-request-id"]
    assert json.loads(raw.value.read())["error"]["code"] == "rate_limit_exceeded"

    assert client.batches.retrieve(batch["id"]).id == batch["id"]  # two 429s, then 200
    log = _retrieve_log(admin, path)
    assert [r["status"] for r in log] == [429, 429, 429, 200]
    sdk_calls = log[1:]
    assert [r["retry_count"] for r in sdk_calls] == [0, 1, 2]
    for before, after in zip(sdk_calls, sdk_calls[1:]):
        assert after["monotonic"] - before["monotonic"] >= 0.6


def test_a_server_error_carries_retry_after_only_when_asked(sandbox_url: str, admin: SandboxAdmin) -> None:
    """A real 500 carries no retry-after (the SDKs back off on their own); ``retry_after_ms`` adds one, so a test
    of a recovering provider need not wait out the SDK's backoff."""
    request = urllib.request.Request(sandbox_url + "/v1/batches", headers={"Authorization": "Bearer sk-sandbox"})
    for params, want in (({}, None), ({"retry_after_ms": 1500}, ("1500", "2"))):
        admin.set_scenario("server_error", on=["list_batches"], **params)
        with pytest.raises(urllib.error.HTTPError) as raw:
            urllib.request.urlopen(request, timeout=5)
        assert raw.value.code == 500
        got = raw.value.headers["retry-after-ms"], raw.value.headers["retry-after"]
        assert got == (want or (None, None))


def test_rate_limit_beyond_the_sdk_retries_raises(client: openai.OpenAI, admin: SandboxAdmin) -> None:
    admin.set_scenario("rate_limit", on=["upload_file"])  # defaults: times 3, retry_after_ms 50
    with pytest.raises(openai.RateLimitError):
        upload(client, [chat_line("x", "y")])
    assert [r["status"] for r in _retrieve_log(admin, "/v1/files")] == [429, 429, 429]
    upload(client, [chat_line("x", "y")])


def test_server_error_is_retried_and_commit_leaves_a_ghost_batch(client: openai.OpenAI, admin: SandboxAdmin) -> None:
    file_id = upload(client, [chat_line("se", "hi")])
    admin.set_scenario("server_error", on=["create_batch"], commit=True)
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    assert [r["status"] for r in _retrieve_log(admin, "/v1/batches")] == [500, 200]
    ids = [b.id for b in client.batches.list()]
    assert len(ids) == 2 and batch.id in ids  # the failed call created a batch too


def test_bad_or_missing_key_is_refused(sandbox_url: str, admin: SandboxAdmin) -> None:
    bad = openai.OpenAI(base_url=sandbox_url + "/v1", api_key="sk-sandbox-bad", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        bad.batches.list()
    assert caught.value.code == "invalid_api_key"
    assert caught.value.request_id

    with pytest.raises(urllib.error.HTTPError) as raw:
        urllib.request.urlopen(sandbox_url + "/v1/files", timeout=5)
    assert raw.value.code == 401 and raw.value.headers["x-request-id"]
    assert set(json.loads(raw.value.read())["error"]) == {"message", "type", "param", "code"}


def test_invalid_input_fails_validation_with_line_numbers(client: openai.OpenAI, admin: SandboxAdmin) -> None:
    good = chat_line("ok", "fine")
    wrong_url = dict(chat_line("u", "x"), url="/v1/embeddings")
    lines = [good, "{not json", chat_line("ok", "duplicate id"), chat_line("m", "x", model="other-model"), wrong_url]
    batch = wait_for(client, submit(client, lines)["id"])
    assert batch["status"] == "failed" and batch["failed_at"] is not None
    found = {(e["line"], e["code"]) for e in batch["errors"]["data"]}
    assert found == {
        (2, "invalid_json_line"),
        (3, "duplicate_custom_id"),
        (4, "mismatched_model"),
        (5, "invalid_url"),
    }
    assert batch["output_file_id"] is None and admin.ledger() == []


def test_fail_validation_scenario_reports_line_numbers(client: openai.OpenAI, admin: SandboxAdmin) -> None:
    lines = [chat_line(f"fv{i}", "fine") for i in range(4)]
    metadata = {"sandbox_scenario": "fail_validation", "sandbox_param_lines": "[2, 4]"}
    batch = wait_for(client, submit(client, lines, metadata=metadata)["id"])
    assert batch["status"] == "failed"
    assert [e["line"] for e in batch["errors"]["data"]] == [2, 4]


def test_create_batch_checks_its_parameters(client: openai.OpenAI, admin: SandboxAdmin) -> None:
    file_id = upload(client, [chat_line("p", "x")])

    def create(**overrides: object) -> None:
        args = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h", **overrides}
        client.batches.create(**args)  # type: ignore[arg-type]

    too_many = {f"k{i}": "v" for i in range(17)}
    for metadata in (too_many, {"k" * 65: "v"}, {"k": "v" * 513}, {"sandbox_scenario": "nope"}):
        with pytest.raises(openai.BadRequestError):
            create(metadata=metadata)
    with pytest.raises(openai.BadRequestError):
        create(endpoint="/v1/images/generations")  # not an endpoint the Batch API serves
    with pytest.raises(openai.NotFoundError):
        create(input_file_id="file-missing")
    create(metadata={f"k{i}": "v" * 512 for i in range(16)})  # the limits themselves are fine
    assert len(client.batches.list().data) == 1


def test_unknown_paths_answer_in_the_error_envelope(sandbox_url: str, admin: SandboxAdmin) -> None:
    request = urllib.request.Request(sandbox_url + "/v1/nothing", headers={"Authorization": "Bearer k"})
    with pytest.raises(urllib.error.HTTPError) as raw:
        urllib.request.urlopen(request, timeout=5)
    assert raw.value.code == 404 and raw.value.headers["x-request-id"]
    assert json.loads(raw.value.read())["error"]["type"] == "invalid_request_error"
