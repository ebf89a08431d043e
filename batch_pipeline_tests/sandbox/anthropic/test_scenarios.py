"""Anthropic scenarios, markers, caching and the ledger; plus unknown_model / no_credit / refuse on OpenAI."""

from __future__ import annotations

from collections import Counter
from typing import Any

import anthropic
import jsonschema
import openai
import pytest

from batch_pipeline.sandbox import SandboxAdmin

from ..support import chat_line, message_content, read_jsonl, submit, upload, wait_for
from .test_api import create, request, results, retrieve, wait_ended

LABELS = ["billing", "bug", "other"]
SCHEMA = {
    "type": "object",
    "properties": {"label": {"type": "string", "enum": LABELS}},
    "required": ["label"],
    "additionalProperties": False,
}
TOOL = {"tools": [{"name": "answer", "input_schema": SCHEMA}], "tool_choice": {"type": "tool", "name": "answer"}}
LONG_SYSTEM = "You label support tickets carefully. " * 200  # > 1024 tokens: long enough to be cached


def by_id(lines: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Result objects keyed by custom_id."""
    return {line["custom_id"]: line["result"] for line in lines}


def test_expiry_at_24_hours_keeps_partial_results(aclient: anthropic.Anthropic, admin: SandboxAdmin) -> None:
    admin.set_scenario("slow", in_progress_s=48 * 3600)
    admin.clock(freeze=True)
    batch_id = create(aclient, [request(f"ex{i}", f"item {i}") for i in range(10)])["id"]
    admin.clock(advance_s=3600)
    assert retrieve(aclient, batch_id)["processing_status"] == "in_progress"
    admin.clock(advance_s=23 * 3600)
    ended = retrieve(aclient, batch_id)
    assert ended["processing_status"] == "ended" and ended["ended_at"] == ended["expires_at"]
    assert ended["request_counts"] == {"processing": 0, "succeeded": 4, "errored": 0, "canceled": 0, "expired": 6}
    kinds = Counter(line["result"]["type"] for line in results(aclient, batch_id))
    assert kinds == {"succeeded": 4, "expired": 6}
    assert len(admin.ledger()) == 4


def test_expire_scenario_keeps_the_complete_share(aclient: anthropic.Anthropic, admin: SandboxAdmin) -> None:
    admin.set_scenario("expire", complete_share=0.3)
    batch = wait_ended(aclient, create(aclient, [request(f"s{i}", "x") for i in range(10)])["id"])
    assert batch["request_counts"] == {"processing": 0, "succeeded": 3, "errored": 0, "canceled": 0, "expired": 7}
    assert sorted(e["custom_id"] for e in admin.ledger()) == sorted(
        cid for cid, result in by_id(results(aclient, batch["id"])).items() if result["type"] == "succeeded"
    )


def test_line_errors_fail_once_then_succeed_and_bill_once(aclient: anthropic.Anthropic, admin: SandboxAdmin) -> None:
    admin.set_scenario("line_errors", rate=0.5)
    reqs = [request(f"le{i}", f"item {i}") for i in range(20)]
    first = wait_ended(aclient, create(aclient, reqs)["id"])
    failed = {cid for cid, r in by_id(results(aclient, first["id"])).items() if r["type"] == "errored"}
    assert 0 < len(failed) < 20
    assert first["request_counts"]["errored"] == len(failed)
    for cid in failed:
        error = by_id(results(aclient, first["id"]))[cid]["error"]
        assert error["type"] == "error" and error["error"]["type"] == "api_error"
    second = wait_ended(aclient, create(aclient, [r for r in reqs if r["custom_id"] in failed])["id"])
    assert second["request_counts"]["succeeded"] == len(failed) and second["request_counts"]["errored"] == 0
    billed = Counter(e["custom_id"] for e in admin.ledger())
    assert set(billed) == {r["custom_id"] for r in reqs} and set(billed.values()) == {1}
    results(aclient, second["id"])  # reading results again bills nothing
    assert len(admin.ledger()) == 20


def test_markers_poison_truncate_refuse_and_forced_tool_output(
    aclient: anthropic.Anthropic, admin: SandboxAdmin
) -> None:
    reqs = [
        request("poison", "bad [[sandbox:poison]]"),
        request("trunc", "a fairly long question about many things [[sandbox:truncate]]"),
        request("refuse", "do something bad [[sandbox:refuse]]"),
        request("label", "my invoice is wrong, a billing problem", **TOOL),
        request("label_trunc", "an app bug [[sandbox:truncate]]", **TOOL),
        request("capped", "one two three four five six seven eight", max_tokens=2),
    ]
    batch = wait_ended(aclient, create(aclient, reqs)["id"])
    assert batch["request_counts"]["errored"] == 1 and batch["request_counts"]["succeeded"] == 5
    got = by_id(results(aclient, batch["id"]))
    assert got["poison"]["error"]["error"]["type"] == "invalid_request_error"
    trunc = got["trunc"]["message"]
    assert trunc["stop_reason"] == "max_tokens" and trunc["usage"]["output_tokens"] > 0
    assert len(trunc["content"][0]["text"]) < len("Sandbox reply to: a fairly long question about many things.")
    refused = got["refuse"]["message"]
    assert refused["stop_reason"] == "refusal" and refused["content"] == [{"type": "text", "text": ""}]
    label = got["label"]["message"]
    assert label["stop_reason"] == "tool_use" and label["content"][0]["type"] == "tool_use"
    assert label["content"][0]["name"] == "answer" and label["content"][0]["input"] == {"label": "billing"}
    jsonschema.validate(label["content"][0]["input"], SCHEMA)
    assert got["label_trunc"]["message"]["stop_reason"] == "max_tokens"
    assert got["capped"]["message"]["stop_reason"] == "max_tokens"
    assert got["capped"]["message"]["usage"]["output_tokens"] == 2
    again = wait_ended(aclient, create(aclient, [request("poison", "bad [[sandbox:poison]]")])["id"])
    assert again["request_counts"]["errored"] == 1  # poison fails every time
    assert "poison" not in {e["custom_id"] for e in admin.ledger()}


def test_cache_control_prefix_is_written_once_then_read(aclient: anthropic.Anthropic, admin: SandboxAdmin) -> None:
    system = [{"type": "text", "text": LONG_SYSTEM, "cache_control": {"type": "ephemeral"}}]
    short = [{"type": "text", "text": "Short.", "cache_control": {"type": "ephemeral"}}]
    first = wait_ended(aclient, create(aclient, [request(f"k{i}", f"t {i}", system=system) for i in range(4)])["id"])
    usages = [r["message"]["usage"] for r in by_id(results(aclient, first["id"])).values()]
    writes = [u for u in usages if u["cache_creation_input_tokens"] > 0]
    assert len(writes) == 1 and writes[0]["cache_read_input_tokens"] == 0
    prefix = writes[0]["cache_creation_input_tokens"]
    assert prefix > 1024
    assert sorted(u["cache_read_input_tokens"] for u in usages) == [0, prefix, prefix, prefix]
    second = wait_ended(
        aclient, create(aclient, [request("k9", "t", system=system), request("s1", "t", system=short)])["id"]
    )
    got = by_id(results(aclient, second["id"]))
    assert got["k9"]["message"]["usage"]["cache_read_input_tokens"] == prefix
    assert got["k9"]["message"]["usage"]["cache_creation_input_tokens"] == 0
    assert got["s1"]["message"]["usage"]["cache_read_input_tokens"] == 0  # below the minimum: never cached
    ledger = {e["custom_id"]: e for e in admin.ledger()}
    k9 = got["k9"]["message"]["usage"]
    assert ledger["k9"]["cached_tokens"] == prefix
    assert ledger["k9"]["input_tokens"] == k9["input_tokens"] + prefix


def test_unknown_model_no_credit_and_the_error_shapes(aclient: anthropic.Anthropic, admin: SandboxAdmin) -> None:
    with pytest.raises(anthropic.NotFoundError) as unknown:
        aclient.messages.batches.create(requests=[request("u", "x", model="unknown-model-1")])  # type: ignore
    assert unknown.value.body == {
        "type": "error",
        "error": {"type": "not_found_error", "message": "model: unknown-model-1"},
    }
    admin.set_scenario("unknown_model")
    with pytest.raises(anthropic.NotFoundError):
        aclient.messages.batches.create(requests=[request("u", "x")])  # type: ignore[list-item]
    admin.set_scenario("no_credit")
    with pytest.raises(anthropic.BadRequestError, match="credit balance is too low") as broke:
        aclient.messages.batches.create(requests=[request("u", "x")])  # type: ignore[list-item]
    assert broke.value.type == "invalid_request_error" and broke.value.request_id
    assert aclient.messages.batches.list().data == [] and admin.ledger() == []


def test_rate_limit_and_server_error_are_retried_by_the_sdk(aclient: anthropic.Anthropic, admin: SandboxAdmin) -> None:
    admin.set_scenario("rate_limit", times=2, retry_after_ms=300, on=["anthropic_create"])
    batch = aclient.messages.batches.create(requests=[request("rl", "x")])  # type: ignore[list-item]
    log = [r for r in admin.requests() if r["path"] == "/v1/messages/batches" and r["method"] == "POST"]
    assert [r["status"] for r in log] == [429, 429, 200]
    assert [r["retry_count"] for r in log] == [0, 1, 2]
    for before, after in zip(log, log[1:]):
        assert after["monotonic"] - before["monotonic"] >= 0.3  # retry-after-ms honoured
    admin.set_scenario("server_error", on=["anthropic_retrieve", "anthropic_results"])
    assert aclient.messages.batches.retrieve(batch.id).id == batch.id
    wait_ended(aclient, batch.id)
    assert [line["custom_id"] for line in results(aclient, batch.id)] == ["rl"]
    statuses = [r["status"] for r in admin.requests() if r["path"].endswith("/results")]
    assert statuses == [500, 200]
    admin.set_scenario("rate_limit", times=5, on=["anthropic_list"])
    with pytest.raises(anthropic.RateLimitError) as limited:
        aclient.messages.batches.list()
    assert limited.value.type == "rate_limit_error"


def test_server_error_with_commit_leaves_a_ghost_batch(aclient: anthropic.Anthropic, admin: SandboxAdmin) -> None:
    admin.set_scenario("server_error", on=["anthropic_create"], commit=True)
    batch = aclient.messages.batches.create(requests=[request("g", "x")])  # type: ignore[list-item]
    ids = [b.id for b in aclient.messages.batches.list()]
    assert len(ids) == 2 and batch.id in ids


# --- the same account scenarios and the refuse marker on the OpenAI side ------------------------------------------
def test_openai_unknown_model_and_no_credit(client: openai.OpenAI, admin: SandboxAdmin) -> None:
    file_id = upload(client, [chat_line("u", "x", model="unknown-gpt")])
    with pytest.raises(openai.NotFoundError) as unknown:
        client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    assert unknown.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        submit(client, [chat_line("u", "x")], metadata={"sandbox_scenario": "unknown_model"})
    admin.set_scenario("no_credit")
    file_id = upload(client, [chat_line("c", "x")])
    with pytest.raises(openai.RateLimitError) as broke:
        client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    assert broke.value.code == "insufficient_quota"
    assert broke.value.response.headers["x-should-retry"] == "false"
    creates = [r for r in admin.requests() if r["path"] == "/v1/batches" and r["method"] == "POST"]
    assert [r["status"] for r in creates] == [404, 404, 429]  # x-should-retry: false stops the SDK's retries
    assert client.batches.list().data == []


def test_openai_refuse_marker(client: openai.OpenAI, admin: SandboxAdmin) -> None:
    batch = wait_for(client, submit(client, [chat_line("r", "bad [[sandbox:refuse]]"), chat_line("ok", "hi")])["id"])
    lines = {line["custom_id"]: line for line in read_jsonl(client, batch["output_file_id"])}
    message = lines["r"]["response"]["body"]["choices"][0]["message"]
    assert message["content"] is None and message["refusal"] == "I can't help with that."
    assert lines["r"]["response"]["body"]["choices"][0]["finish_reason"] == "stop"
    assert message_content(lines["ok"]).startswith("Sandbox reply")
