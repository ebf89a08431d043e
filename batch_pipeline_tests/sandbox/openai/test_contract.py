"""The responses honour the request's output contract, markers and token limits."""

from __future__ import annotations

import json
import re
from typing import Any

import bpe_openai
import jsonschema
import openai
import pytest

from batch_pipeline.sandbox import SandboxAdmin

from ..support import chat_line, message_content, read_jsonl, submit, wait_for

LABELS = ["billing_issue", "technical_problem", "praise", "other"]
TICKET_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "label": {"type": "string", "enum": LABELS},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        "priority": {"type": "integer", "minimum": 1, "maximum": 5},
        "urgent": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 2, "maxItems": 3},
        "owner": {"$ref": "#/$defs/person"},
        "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    },
    "required": ["label", "confidence", "priority", "urgent", "tags", "owner", "note"],
    "additionalProperties": False,
    "$defs": {
        "person": {
            "type": "object",
            "properties": {"name": {"type": "string", "minLength": 3}, "team": {"enum": ["red", "blue"]}},
            "required": ["name", "team"],
            "additionalProperties": False,
        }
    },
}


def _schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "ticket", "strict": True, "schema": schema}}


def test_json_schema_outputs_validate_and_labels_follow_the_text(client: openai.OpenAI, admin: SandboxAdmin) -> None:
    texts = {
        "t-tech": "The app crashes on start: a Technical_Problem, clearly.",
        "t-billing": "I was charged twice, this billing thing is an issue for me.",
        "t-praise": "Just wanted to send praise to the team!",
        "t-none-1": "Nothing matches here at all.",
        "t-none-2": "Nothing matches here at all.",
    }
    lines = [chat_line(cid, text, response_format=_schema_format(TICKET_SCHEMA)) for cid, text in texts.items()]
    batch = wait_for(client, submit(client, lines)["id"])
    assert batch["request_counts"]["completed"] == len(texts)
    answers = {ln["custom_id"]: json.loads(message_content(ln)) for ln in read_jsonl(client, batch["output_file_id"])}
    for answer in answers.values():
        jsonschema.Draft202012Validator(TICKET_SCHEMA).validate(answer)
    assert answers["t-tech"]["label"] == "technical_problem"
    assert answers["t-billing"]["label"] == "billing_issue"  # its words, split on "_", all occur
    assert answers["t-praise"]["label"] == "praise"
    assert answers["t-none-1"] == answers["t-none-2"]  # same text, same (hashed) answer


def test_outputs_and_their_order_are_deterministic(client: openai.OpenAI, admin: SandboxAdmin) -> None:
    fmt = _schema_format(TICKET_SCHEMA)
    lines = [chat_line(f"same-{i}", f"An unrelated message {i}.", response_format=fmt) for i in range(6)]
    runs = []
    for _ in range(2):
        batch = wait_for(client, submit(client, lines)["id"])
        runs.append([(ln["custom_id"], message_content(ln)) for ln in read_jsonl(client, batch["output_file_id"])])
    assert runs[0] == runs[1]


def test_markers_and_token_limits(client: openai.OpenAI, admin: SandboxAdmin) -> None:
    lines = [
        chat_line("plain", "Tell me about the weather in Paris today."),
        chat_line("json", "Give me a ticket.", response_format=_schema_format(TICKET_SCHEMA)),
        chat_line("truncated", "Give me a ticket [[sandbox:truncate]]", response_format=_schema_format(TICKET_SCHEMA)),
        chat_line("capped", "Tell me about the weather in Paris today.", max_completion_tokens=3),
        chat_line("poison", "Break please [[sandbox:poison]]"),
    ]
    batch = wait_for(client, submit(client, lines)["id"])
    assert batch["status"] == "completed"  # per-request failures do not fail the batch
    assert batch["request_counts"] == {"total": 5, "completed": 4, "failed": 1}
    output = {ln["custom_id"]: ln for ln in read_jsonl(client, batch["output_file_id"])}
    choice = {cid: line["response"]["body"]["choices"][0] for cid, line in output.items()}
    assert choice["plain"]["finish_reason"] == "stop"
    assert choice["json"]["finish_reason"] == "stop"
    json.loads(choice["json"]["message"]["content"])
    assert choice["truncated"]["finish_reason"] == "length"
    truncated = choice["truncated"]["message"]["content"]
    assert truncated.startswith("{")
    with pytest.raises(ValueError):  # a truncated JSON answer does not parse
        json.loads(truncated)
    assert choice["capped"]["finish_reason"] == "length"
    assert output["capped"]["response"]["body"]["usage"]["completion_tokens"] == 3

    errors = read_jsonl(client, batch["error_file_id"])
    assert [e["custom_id"] for e in errors] == ["poison"]
    assert errors[0]["response"]["status_code"] == 400
    assert errors[0]["response"]["body"]["error"]["type"] == "invalid_request_error"
    assert "poison" not in {e["custom_id"] for e in admin.ledger()}


def test_token_counts_follow_the_documented_rule(client: openai.OpenAI, admin: SandboxAdmin) -> None:
    system, user = "You are terse.", "Hello, world! How's it going?"
    batch = wait_for(client, submit(client, [chat_line("count", user, system=system)])["id"])
    line = read_jsonl(client, batch["output_file_id"])[0]
    usage = line["response"]["body"]["usage"]
    o200k = bpe_openai.get_encoding("o200k_base")  # an independent implementation of the encoding billed

    def words(text):
        return len(re.findall(r"\w+|[^\w\s]", text))

    # two messages of 4 framing tokens each, and the 3 tokens that prime the reply (no output schema here)
    assert usage["prompt_tokens"] == len(o200k.encode_ordinary(system)) + len(o200k.encode_ordinary(user)) + 2 * 4 + 3
    assert usage["completion_tokens"] == words(message_content(line))
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
