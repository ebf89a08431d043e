"""The in-process API: SandboxServer, loopback-only binding, the CLI, persistence and the schema filler."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

from batch_pipeline.sandbox import SandboxServer
from batch_pipeline.sandbox.schema_fill import fill_schema, pick_label

from .support import chat_line, read_jsonl, submit, wait_for


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        assert response.headers["x-request-id"]
        return json.loads(response.read())


def test_server_thread_starts_and_stops() -> None:
    server = SandboxServer(port=0).start()
    try:
        assert server.url.startswith("http://127.0.0.1:") and server.port > 0
        assert _get(server.url + "/_sandbox/health") == {"ok": True, "sandbox": True}
    finally:
        server.stop()
    with pytest.raises(OSError):
        urllib.request.urlopen(server.url + "/_sandbox/health", timeout=2)


def test_only_loopback_is_accepted() -> None:
    with pytest.raises(ValueError, match="loopback"):
        SandboxServer(port=0, host="0.0.0.0")
    cli = subprocess.run(
        [sys.executable, "-m", "batch_pipeline.sandbox", "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert cli.returncode == 2 and "loopback" in cli.stderr and cli.stdout == ""


def test_state_dir_keeps_batches_across_a_restart(tmp_path: Path) -> None:
    with SandboxServer(port=0, state_dir=str(tmp_path)) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="k")
        batch = wait_for(client, submit(client, [chat_line("keep", "remember me")])["id"])
        before = read_jsonl(client, batch["output_file_id"])
    with SandboxServer(port=0, state_dir=str(tmp_path)) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="k")
        assert client.batches.retrieve(batch["id"]).status == "completed"
        assert read_jsonl(client, batch["output_file_id"]) == before
        assert len(_get(server.url + "/_sandbox/ledger")["entries"]) == 1


def test_pick_label_prefers_text_then_words_then_hash() -> None:
    labels = ["billing_issue", "technical_problem", "other"]
    assert pick_label(labels, "A TECHNICAL_PROBLEM again") == "technical_problem"
    assert pick_label(labels, "the issue is about billing") == "billing_issue"
    assert pick_label(labels, "first other, then technical_problem") == "other"  # earliest occurrence wins
    hashed = pick_label(labels, "no match")
    assert hashed in labels and pick_label(labels, "no match") == hashed


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "enum": ["a", "b"]},
        {"type": "array", "items": {"enum": ["x", "y", "z"]}, "minItems": 3, "uniqueItems": True},
        {"type": "integer", "exclusiveMinimum": 10, "exclusiveMaximum": 12},
        {"type": "number", "minimum": -2.5, "maximum": -1},
        {"type": ["null", "boolean"]},
        {
            "allOf": [
                {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"properties": {"b": {"const": 7}}, "required": ["b"]},
            ]
        },
        {
            "type": "object",
            "properties": {"kids": {"type": "array", "items": {"$ref": "#"}, "maxItems": 0}},
            "required": ["kids"],
            "additionalProperties": False,
        },
        {"type": "string", "format": "date-time", "maxLength": 30},
    ],
)
def test_filled_values_validate(schema: dict[str, Any]) -> None:
    value = fill_schema(schema, "some message")
    jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker()).validate(value)
