"""Round trip, progress, listing and billing through the real openai SDK over HTTP."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import bpe_openai
import openai
import pytest

from batch_pipeline.sandbox import SandboxAdmin

from .support import MODEL, chat_line, message_content, read_jsonl, retrieve, submit, validate_spec, wait_for


def test_round_trip_objects_match_the_openapi_schemas(client: openai.OpenAI, admin: SandboxAdmin) -> None:
    lines = [chat_line(f"req-{i}", f"Summarise item number {i}.") for i in range(12)]
    created = submit(client, lines, metadata={"job": "round-trip"})
    assert created["status"] == "validating"
    assert created["metadata"] == {"job": "round-trip"}

    statuses: list[str] = []
    final = wait_for(client, created["id"], seen=lambda b: statuses.append(b["status"]))
    assert final["status"] == "completed"
    assert "in_progress" in statuses
    assert final["request_counts"] == {"total": 12, "completed": 12, "failed": 0}
    assert final["model"] == MODEL
    assert final["error_file_id"] is None
    assert (
        final["created_at"]
        <= final["in_progress_at"]
        <= final["finalizing_at"]
        <= final["completed_at"]
        < final["expires_at"]
    )

    output_meta = json.loads(client.files.with_raw_response.retrieve(final["output_file_id"]).text)
    validate_spec("OpenAIFile", output_meta)
    assert output_meta["purpose"] == "batch_output"

    output = read_jsonl(client, final["output_file_id"])
    assert output_meta["bytes"] == len(client.files.content(final["output_file_id"]).content)
    ids = [line["custom_id"] for line in output]
    assert Counter(ids) == Counter(line["custom_id"] for line in lines)
    assert ids != [line["custom_id"] for line in lines], "output order must differ from input order"
    for line in output:
        assert line["id"].startswith("batch_req_") and line["error"] is None
        assert line["response"]["status_code"] == 200 and line["response"]["request_id"]
        body = line["response"]["body"]
        validate_spec("CreateChatCompletionResponse", body)
        assert body["model"] == MODEL and body["system_fingerprint"] == "sandbox"
        assert body["choices"][0]["finish_reason"] == "stop"
        assert message_content(line).startswith("Sandbox reply to: Summarise item number")

    usage = final["usage"]
    assert usage["input_tokens"] == sum(ln["response"]["body"]["usage"]["prompt_tokens"] for ln in output)
    assert usage["output_tokens"] == sum(ln["response"]["body"]["usage"]["completion_tokens"] for ln in output)
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]

    listing = json.loads(client.files.with_raw_response.list().text)
    validate_spec("ListFilesResponse", listing)
    assert {f["id"] for f in listing["data"]} == {created["input_file_id"], final["output_file_id"]}

    deleted = json.loads(client.files.with_raw_response.delete(created["input_file_id"]).text)
    validate_spec("DeleteFileResponse", deleted)
    assert deleted == {"id": created["input_file_id"], "object": "file", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(created["input_file_id"])


def test_progress_grows_while_in_progress(client: openai.OpenAI, admin: SandboxAdmin) -> None:
    admin.clock(freeze=True)
    lines = [chat_line(f"p{i}", f"text {i}") for i in range(10)]
    batch = submit(client, lines, metadata={"sandbox_scenario": "slow", "sandbox_param_in_progress_s": "10"})
    admin.clock(advance_s=0.1)
    started = retrieve(client, batch["id"])
    assert started["status"] == "in_progress"
    assert started["request_counts"] == {"total": 10, "completed": 0, "failed": 0}
    admin.clock(advance_s=5.0)
    halfway = retrieve(client, batch["id"])
    assert halfway["status"] == "in_progress"
    assert halfway["request_counts"]["completed"] == 5
    assert halfway["output_file_id"] is None
    admin.clock(advance_s=4.97)  # in_progress ends at 10.05 s, finalizing at 10.10 s
    assert retrieve(client, batch["id"])["status"] == "finalizing"
    admin.clock(advance_s=1.0)
    done = retrieve(client, batch["id"])
    assert done["status"] == "completed" and done["request_counts"]["completed"] == 10


def test_list_batches_paginates_newest_first(client: openai.OpenAI, admin: SandboxAdmin) -> None:
    created = [submit(client, [chat_line("only", f"batch {i}")])["id"] for i in range(5)]
    newest_first = list(reversed(created))

    first = json.loads(client.batches.with_raw_response.list(limit=2).text)
    validate_spec("ListBatchesResponse", first)
    assert [b["id"] for b in first["data"]] == newest_first[:2]
    assert first["has_more"] is True
    assert (first["first_id"], first["last_id"]) == (newest_first[0], newest_first[1])

    last = json.loads(client.batches.with_raw_response.list(limit=2, after=newest_first[3]).text)
    assert [b["id"] for b in last["data"]] == newest_first[4:]
    assert last["has_more"] is False

    assert [b.id for b in client.batches.list(limit=2)] == newest_first  # SDK auto-pagination
    assert len(client.batches.list().data) == 5  # default limit 20
    for bad in (0, 101):
        with pytest.raises(openai.BadRequestError):
            client.batches.list(limit=bad)


def test_ledger_bills_each_succeeded_line_once(client: openai.OpenAI, admin: SandboxAdmin) -> None:
    lines = [chat_line(f"b{i}", f"bill me {i}") for i in range(6)]
    lines.append(chat_line("b-poison", "this one fails [[sandbox:poison]]"))
    batch = wait_for(client, submit(client, lines)["id"])
    for _ in range(3):  # polling a finished batch again must not bill again
        retrieve(client, batch["id"])
    client.batches.list()

    ledger = admin.ledger()
    assert len(ledger) == batch["request_counts"]["completed"] == 6
    assert Counter((e["batch_id"], e["custom_id"]) for e in ledger).most_common(1)[0][1] == 1
    assert {e["custom_id"] for e in ledger} == {f"b{i}" for i in range(6)}
    output = read_jsonl(client, batch["output_file_id"])
    by_id: dict[str, Any] = {line["custom_id"]: line["response"]["body"]["usage"] for line in output}
    for entry in ledger:
        assert entry["model"] == MODEL
        assert entry["input_tokens"] == by_id[entry["custom_id"]]["prompt_tokens"]
        assert entry["output_tokens"] == by_id[entry["custom_id"]]["completion_tokens"]
    assert sum(e["input_tokens"] for e in ledger) == batch["usage"]["input_tokens"]


def test_long_system_prompt_is_cached_after_first_sight(client: openai.OpenAI, admin: SandboxAdmin) -> None:
    system = " ".join(f"rule{i}" for i in range(1100))
    prefix = len(bpe_openai.get_encoding("o200k_base").encode_ordinary(system)) + 4  # o200k tokens + 4 per message
    lines = [chat_line(f"c{i}", f"question {i}", system=system) for i in range(4)]
    lines.append(chat_line("short", "no long prefix", system="Be brief."))
    batch = wait_for(client, submit(client, lines)["id"])
    output = {ln["custom_id"]: ln["response"]["body"]["usage"] for ln in read_jsonl(client, batch["output_file_id"])}
    cached = sorted(output[f"c{i}"]["prompt_tokens_details"]["cached_tokens"] for i in range(4))
    assert cached == [0, prefix, prefix, prefix]
    assert output["short"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert batch["usage"]["input_tokens_details"]["cached_tokens"] == 3 * prefix
    assert sum(e["cached_tokens"] for e in admin.ledger()) == 3 * prefix
