"""Helpers for the sandbox contract tests: request lines, batch polling, OpenAPI validation."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import openai

SPEC_PATH = Path(__file__).resolve().parents[1] / "fixtures" / "openai-files-batches.openapi.json"
MODEL = "gpt-4o-mini"
TERMINAL = ("completed", "failed", "expired", "cancelled")


def _nullable_optionals(node: Any) -> Any:
    """A copy of a schema in which every non-required property also accepts null (the live API sends nulls)."""
    if isinstance(node, list):
        return [_nullable_optionals(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _nullable_optionals(value) for key, value in node.items()}
    if isinstance(out.get("properties"), dict):
        required = set(out.get("required", []))
        out["properties"] = {
            name: sub if name in required else {"anyOf": [sub, {"type": "null"}]}
            for name, sub in out["properties"].items()
        }
    return out


@cache
def _components() -> dict[str, Any]:
    spec = json.loads(SPEC_PATH.read_text(encoding="utf-8"))
    return _nullable_optionals(copy.deepcopy(spec["components"]))


@cache
def _validator(schema_name: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator({"$ref": f"#/components/schemas/{schema_name}", "components": _components()})


def validate_spec(schema_name: str, instance: Any) -> None:
    """Validate ``instance`` against ``#/components/schemas/<schema_name>`` of the OpenAPI document."""
    _validator(schema_name).validate(instance)


def chat_line(
    custom_id: str, text: str, *, model: str = MODEL, system: str | None = None, **body: Any
) -> dict[str, Any]:
    """One batch input line for /v1/chat/completions."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": model, "messages": messages, **body},
    }


def to_jsonl(lines: list[Any]) -> bytes:
    """Lines as JSONL bytes (strings are written as they are)."""
    return "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines).encode()


def upload(client: openai.OpenAI, lines: list[Any]) -> str:
    """Upload a batch input file; returns its id (the file object is checked against the spec)."""
    raw = client.files.with_raw_response.create(file=("input.jsonl", to_jsonl(lines)), purpose="batch")
    validate_spec("OpenAIFile", json.loads(raw.text))
    return raw.parse().id


def submit(client: openai.OpenAI, lines: list[Any], metadata: dict[str, str] | None = None) -> dict[str, Any]:
    """Upload and create a batch; returns the raw Batch JSON (checked against the spec)."""
    file_id = upload(client, lines)
    raw = client.batches.with_raw_response.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h", metadata=metadata
    )
    batch = json.loads(raw.text)
    validate_spec("Batch", batch)
    return batch


def retrieve(client: openai.OpenAI, batch_id: str) -> dict[str, Any]:
    """The raw Batch JSON (checked against the spec)."""
    batch = json.loads(client.batches.with_raw_response.retrieve(batch_id).text)
    validate_spec("Batch", batch)
    return batch


def wait_for(
    client: openai.OpenAI,
    batch_id: str,
    statuses: tuple[str, ...] = TERMINAL,
    timeout: float = 10.0,
    seen: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Poll until the batch reaches one of ``statuses``; ``seen`` receives every polled object."""
    deadline = time.monotonic() + timeout
    while True:
        batch = retrieve(client, batch_id)
        if seen is not None:
            seen(batch)
        if batch["status"] in statuses:
            return batch
        if time.monotonic() > deadline:
            raise AssertionError(f"batch {batch_id} stuck in {batch['status']}")
        time.sleep(0.02)


def read_jsonl(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    """The lines of an output or error file ([] when there is no file)."""
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines() if line.strip()]


def message_content(line: dict[str, Any]) -> str:
    """The assistant text of an output line."""
    return str(line["response"]["body"]["choices"][0]["message"]["content"])


def load_events(load: dict[str, Any], provider: str) -> list[dict[str, Any]]:
    """The load ledger's events of one provider (``SandboxAdmin.load()``)."""
    return [e for e in load["events"] if e["provider"] == provider]


def assert_never_over(load: dict[str, Any], provider: str, field: str, cap: int) -> int:
    """No event of ``provider`` took a key's ``field`` past ``cap`` (and ``peak`` agrees); returns the highest."""
    events = load_events(load, provider)
    assert events, f"no {provider} load events"
    highest = max(e[field] for e in events)
    assert highest <= cap, [e for e in events if e[field] > cap]
    assert max(p[field] for p in load["peak"] if p["provider"] == provider) == highest
    return highest


def poll(check: Callable[[], Any], what: str, timeout: float = 15.0) -> Any:
    """``check()`` until it returns something truthy (a generous deadline, polled, never a fixed sleep)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.02)
