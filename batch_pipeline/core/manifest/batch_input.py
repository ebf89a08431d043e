"""OpenAI / vLLM batch input files as job input (``input.format: openai_batch``).

Each line ``{custom_id, method, url, body}`` becomes a row ``{custom_id, system, user, model}`` for the job:
use ``key_field: custom_id``, ``text_field: user`` and ``template: "{user}"``. The system prompt, model,
sampling and output contract are job-level (they are part of every request ID), so a line whose system
prompt or model differs from the spec is rejected with its reason rather than silently re-prompted.

Multi-turn lines: with ``messages_field: messages`` (and no template) the row's ``messages`` is the line's
turns after its leading system message, checked and normalised by ``messages.canonical_turns``.
"""

import json
from collections.abc import Iterator

import polars as pl

from batch_pipeline.core.manifest.messages import TurnError, canonical_turns
from batch_pipeline.core.manifest.reasons import json_reason, json_type
from batch_pipeline.core.manifest.rows import KEY, LINE, InputFile, Reject, RowBatch, file_chunks

CHAT_URL = "/v1/chat/completions"
BLOCK_LINES = 50_000


def _flatten(
    obj: object, expect_system: str | None, expect_model: str | None, messages_field: str | None = None
) -> tuple[dict | None, str, str]:
    """(row, reject kind, reason): row is None when the line is rejected."""
    if not isinstance(obj, dict):
        return None, "not_object", f"expected a JSON object, got {json_type(obj)}"
    if obj.get("method") != "POST" or obj.get("url") != CHAT_URL:
        return (
            None,
            "unsupported_request",
            f"only POST {CHAT_URL} is supported, got {obj.get('method')} {obj.get('url')}",
        )
    custom_id, body = obj.get("custom_id"), obj.get("body")
    if not isinstance(custom_id, str) or not custom_id or not isinstance(body, dict):
        return None, "missing_field", "a line needs a string custom_id and an object body"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return None, "unsupported_messages", "body.messages must be a non-empty list"
    if messages_field is not None:
        return _turns_row(custom_id, messages, body.get("model"), expect_system, expect_model, messages_field)
    system = ""
    if isinstance(messages[0], dict) and messages[0].get("role") in ("system", "developer"):
        system = messages[0].get("content")
        messages = messages[1:]
    if len(messages) > 1:
        return (
            None,
            "unsupported_messages",
            ("a multi-turn line: set input.messages_field: messages (and no template) to import its turns"),
        )
    if (
        len(messages) != 1
        or not isinstance(messages[0], dict)
        or messages[0].get("role") != "user"
        or not isinstance(messages[0].get("content"), str)
        or not isinstance(system, str)
    ):
        return None, "unsupported_messages", "expected an optional system message and one user message, as text"
    if expect_system is not None and system.strip() != expect_system.strip():
        return None, "system_mismatch", "the system message differs from prompt.system of the job spec"
    model = body.get("model")
    if expect_model is not None and model not in (None, expect_model):
        return None, "settings_mismatch", f"model {model!r} differs from the job's model {expect_model!r}"
    return {"custom_id": custom_id, "system": system, "user": messages[0]["content"]}, "", ""


def _turns_row(
    custom_id: str, messages: list, model: object, expect_system: str | None, expect_model: str | None, field: str
) -> tuple[dict | None, str, str]:
    """A multi-turn line: a leading system (or developer) message must be the spec's system prompt (the
    ``canonical_turns`` rule), as must its absence."""
    first = messages[0]
    if isinstance(first, dict) and first.get("role") == "developer":
        messages = [{**first, "role": "system"}, *messages[1:]]
    has_system = isinstance(first, dict) and first.get("role") in ("system", "developer")
    if expect_system and not has_system:
        return None, "system_mismatch", "the line has no system message and prompt.system of the job spec is set"
    if expect_model is not None and model not in (None, expect_model):
        return None, "settings_mismatch", f"model {model!r} differs from the job's model {expect_model!r}"
    try:
        turns = canonical_turns(messages, "body.messages", expect_system or "")
    except TurnError as exc:
        return None, exc.kind, exc.reason
    return {"custom_id": custom_id, field: turns}, "", ""


def read_openai_batch(
    f: InputFile,
    fields: list[str],
    key_field: str | None,
    expect_system: str | None = None,
    expect_model: str | None = None,
    messages_field: str | None = None,
) -> Iterator[RowBatch]:
    rows: list[dict] = []
    rejects: list[Reject] = []
    lines = b"".join(chunk for chunk, _ in file_chunks(f)).split(b"\n")
    for start in range(0, len(lines), BLOCK_LINES):
        for offset, raw in enumerate(lines[start : start + BLOCK_LINES]):
            line = start + offset + 1
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except UnicodeDecodeError as exc:
                rejects.append(
                    Reject(
                        f.uri,
                        line,
                        "",
                        "bad_utf8",
                        f"not valid UTF-8 (byte {exc.start})",
                        raw[:200].decode("utf-8", "replace"),
                    )
                )
                continue
            except json.JSONDecodeError as exc:
                rejects.append(
                    Reject(f.uri, line, "", "bad_json", json_reason(exc), raw[:200].decode("utf-8", "replace"))
                )
                continue
            row, kind, reason = _flatten(obj, expect_system, expect_model, messages_field)
            if row is None:
                rejects.append(Reject(f.uri, line, "", kind, reason, raw[:200].decode("utf-8", "replace")))
                continue
            rows.append({**{n: row.get(n) for n in fields}, LINE: line, KEY: row.get(key_field) if key_field else None})
        frame = pl.DataFrame(rows, schema={**{n: pl.String for n in fields}, LINE: pl.Int64, KEY: pl.String})
        yield RowBatch(f.uri, frame, rejects)
        rows, rejects = [], []
