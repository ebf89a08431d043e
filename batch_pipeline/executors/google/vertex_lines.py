"""Vertex AI batch prediction lines, both ways: ``{"request": GenerateContentRequest}`` out, prediction lines in.

The request and response objects are Gemini's own (``executors/google/format.py``); this module only adds the
Vertex wrapper and the one thing Vertex lacks: a key. An input line has no ID field, and the SDK's
``batches.create`` sends no job labels, so **the request ID rides in the request's own ``labels``**
(``GenerateContentRequest.labels``, which Vertex echoes back in each prediction line's ``request``). A label
value holds at most 63 characters of ``[a-z0-9_-]``, and a request ID is 64 hex characters, so it is stored as
its 32 bytes in lower-case base32 without padding (52 characters; ``encode_id`` / ``decode_id``).

Should a prediction line come back without that label, its echoed ``contents`` are matched instead against the
attempt's input object (``ContentIndex``: a digest of each input line's canonical ``contents`` JSON -> ID), so
an answer is never lost to a dropped label; a line matched by neither is reported as ``unmatched_result``.

Prediction line: ``{"status": "", "processed_time", "request", "response": GenerateContentResponse}``; a failed
request has a non-empty ``status`` text (e.g. ``Bad Request: {"error": {"code": 400, "message", "status"}}``)
and no response. The common lines go through format.py's column-wise parser; failed and unlabelled lines, line
by line.
"""

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from batch_pipeline.core.errors import ConfigError
from batch_pipeline.core.ledger.executor import RAW_RESULT_SCHEMA, ShardWork
from batch_pipeline.executors.google.format import (
    LineLayout,
    contents_writer,
    error_columns,
    missing_result,
    parse_block,
    request_template,
    response_columns,
)
from batch_pipeline.executors.jsonl_blocks import replace_rows

ID_LABEL = "batch_pipeline_rid"
# the error path names a field Vertex never writes: a failed line's error is a text in "status", parsed here
VERTEX_LAYOUT = LineLayout(
    key=f"$.request.labels.{ID_LABEL}", response="$.response", error="$.batch_pipeline_no_error_object"
)
# the reason phrase a status text starts with -> HTTP status, for a text that carries no JSON error
STATUS_PHRASES = {
    "bad request": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "not found": 404,
    "too many requests": 429,
    "resource exhausted": 429,
    "internal server error": 500,
    "internal": 500,
    "service unavailable": 503,
    "deadline exceeded": 504,
    "gateway timeout": 504,
}
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
IdLookup = Callable[[str], str | None]  # contents digest -> request ID


def encode_id(request_id: str) -> str:
    """A 64-hex request ID as a Vertex label value (52 lower-case base32 characters)."""
    if not _HEX64.match(request_id):
        raise ConfigError(
            f"request_id {request_id!r} is not 64 lower-case hex characters; vertex_batch carries "
            "request IDs in request labels and needs the sha256 form"
        )
    return base64.b32encode(bytes.fromhex(request_id)).decode("ascii").rstrip("=").lower()


def decode_id(label: str | None) -> str | None:
    """Inverse of ``encode_id``; None for a missing or malformed label."""
    if not label:
        return None
    try:
        raw = base64.b32decode(label.upper() + "=" * (-len(label) % 8))
    except (binascii.Error, ValueError):
        return None
    return raw.hex() if len(raw) == 32 else None


def contents_digest(contents: Any) -> str:
    """The digest of a request's ``contents`` in canonical JSON (the fallback match of an unlabelled line)."""
    text = json.dumps(contents, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def request_lines(work: ShardWork) -> bytes:
    """The input JSONL: one ``{"request": {...}}`` line per item; the shared part is serialised once."""
    shared = json.dumps(request_template(work.plan), ensure_ascii=False, separators=(",", ":"))[1:-1]
    contents_of = contents_writer(work.plan)
    lines = [
        f'{{"request":{{"contents":{contents_of(prompt)},{shared},"labels":{{"{ID_LABEL}":"{encode_id(rid)}"}}}}}}'
        for rid, prompt in zip(
            work.items.column("request_id").to_pylist(), work.items.column("user_prompt").to_pylist()
        )
    ]
    return ("\n".join(lines) + "\n").encode("utf-8")


def content_index(input_jsonl: bytes) -> dict[str, str]:
    """contents digest -> request ID, from an attempt's input object."""
    index: dict[str, str] = {}
    for line in input_jsonl.splitlines():
        if not line.strip():
            continue
        request = json.loads(line).get("request") or {}
        rid = decode_id((request.get("labels") or {}).get(ID_LABEL))
        if rid is not None:
            index[contents_digest(request.get("contents"))] = rid
    return index


def parse_status(text: str) -> dict[str, Any]:
    """A failed line's ``status`` text as a ``google.rpc.Status`` object (code, message, status[, details])."""
    start = text.find("{")
    if start >= 0:
        try:
            obj = json.loads(text[start:])
        except ValueError:
            obj = None
        if isinstance(obj, dict):
            inner = obj.get("error") if isinstance(obj.get("error"), dict) else obj
            if "code" in inner or "status" in inner:
                return inner
    phrase = text.split(":", 1)[0].strip().lower()
    return {"code": STATUS_PHRASES.get(phrase, 500), "message": text, "status": None}


def _row(line: bytes, lookup: IdLookup | None) -> tuple[Any, ...]:
    raw = line.decode("utf-8", "replace")
    try:
        obj = json.loads(line)
        if not isinstance(obj, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        return (None, None, None, None, None, None, None, "unparseable_line", str(exc)[:500], None, raw)
    request = obj.get("request") if isinstance(obj.get("request"), dict) else {}
    labels = request.get("labels") if isinstance(request.get("labels"), dict) else {}
    rid = decode_id(labels.get(ID_LABEL) if isinstance(labels.get(ID_LABEL), str) else None)
    if rid is None and lookup is not None and "contents" in request:
        rid = lookup(contents_digest(request["contents"]))
    status, response = obj.get("status"), obj.get("response")
    if isinstance(status, str) and status.strip():
        return (rid, *error_columns(parse_status(status)), None, raw)
    if isinstance(status, dict):  # a structured status, should Vertex ever write one
        return (rid, *error_columns(status), None, raw)
    if isinstance(response, dict) and response:
        return (rid, *response_columns(response), raw)
    return missing_result(rid, "the prediction line has neither a response nor a status", raw)


def parse_lines(block: bytes, lookup: IdLookup | None = None) -> pa.Table:
    """Prediction lines one by one (``json.loads``)."""
    rows = [_row(line, lookup) for line in block.split(b"\n") if line.strip()]
    columns = list(zip(*rows)) if rows else [[] for _ in RAW_RESULT_SCHEMA]
    return pa.Table.from_arrays(
        [pa.array(c, f.type) for c, f in zip(columns, RAW_RESULT_SCHEMA, strict=True)], schema=RAW_RESULT_SCHEMA
    )


def parse_predictions_block(block: bytes, lookup: IdLookup | None = None) -> pa.Table:
    """Prediction lines -> RAW_RESULT_SCHEMA rows: column-wise through format.py, then line by line for the rows
    it cannot settle (no response: a failed request; no ID label)."""
    table = parse_block(block, VERTEX_LAYOUT)
    if table.num_rows == 0:
        return table
    labels = table.column("request_id").to_pylist()
    ids = [decode_id(label) for label in labels]
    table = table.set_column(0, RAW_RESULT_SCHEMA.field("request_id"), pa.array(ids, pa.string()))
    odd = pc.or_(pc.is_null(table.column("request_id")), pc.is_null(table.column("http_status")))
    if not pc.any(odd).as_py():
        return table
    slow = b"\n".join(s.encode("utf-8") for s in table.column("raw_payload").filter(odd).to_pylist())
    return replace_rows(table, odd, parse_lines(slow, lookup))
