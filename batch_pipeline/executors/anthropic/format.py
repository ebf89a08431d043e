"""The Anthropic Message Batches result lines, read column-wise (the request side is ``request_format.py``).

Result lines become ``RAW_RESULT_SCHEMA`` rows plus ``cache_write_tokens`` (``ANTHROPIC_RAW_SCHEMA``); only the
rows with a ``tool_use`` block (the forced ``answer`` tool of a choice or JSON-schema contract) are decoded in
Python (their ``input`` is an arbitrary object, which comes back as the output text).

Usage: Anthropic's ``input_tokens`` excludes both cache reads and cache writes. Our ``input_tokens`` is all of
the input (uncached + ``cache_creation_input_tokens`` + ``cache_read_input_tokens``), ``cached_tokens`` the
cache reads and ``cache_write_tokens`` the cache writes, so that ``Price.cost`` bills each at its own rate.
"""

import json
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from batch_pipeline.core.ledger.executor import RAW_OPTIONAL_SCHEMA, RAW_RESULT_SCHEMA
from batch_pipeline.core.store import empty_table
from batch_pipeline.executors.anthropic.request_format import batch_requests, output_schema
from batch_pipeline.executors.jsonl_blocks import (
    json_paths_sql,
    lookup,
    one_chunk,
    parse_columnwise,
    read_lines,
    utf8_or_marker,
)

FINISH_REASONS = {
    "end_turn": "stop",
    "tool_use": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "refusal",
    "pause_turn": "pause_turn",
}
# errored results: Anthropic error type -> the HTTP status the same error would have had online
ERROR_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 500,
}
UNRUN = {
    "canceled": ("batch_cancelled", "This request was not executed because the batch was canceled."),
    "expired": ("batch_expired", "This request was not executed before the batch expired (24 h)."),
}

# the request side lives in request_format.py; batch_requests and output_schema stay importable from here
__all__ = ["ANTHROPIC_RAW_SCHEMA", "FINISH_REASONS", "batch_requests", "output_schema", "parse_results_block"]
_STR, _INT = pa.string(), pa.int64()
# the result rows of this format: the raw columns, then the cache writes Anthropic bills apart
ANTHROPIC_RAW_SCHEMA = pa.schema([*RAW_RESULT_SCHEMA, RAW_OPTIONAL_SCHEMA.field("cache_write_tokens")])
Column = pa.Array | pa.ChunkedArray  # a column as Arrow compute returns it
_USAGE = pa.struct(
    [
        ("input_tokens", _INT),
        ("output_tokens", _INT),
        ("cache_creation_input_tokens", _INT),
        ("cache_read_input_tokens", _INT),
    ]
)
_MESSAGE = pa.struct(
    [
        ("id", _STR),
        ("content", pa.list_(pa.struct([("type", _STR), ("text", _STR)]))),
        ("stop_reason", _STR),
        ("usage", _USAGE),
    ]
)
_ERROR = pa.struct([("type", _STR), ("error", pa.struct([("type", _STR), ("message", _STR)]))])
RESULT_LINE_SCHEMA = pa.schema(
    [("custom_id", _STR), ("result", pa.struct([("type", _STR), ("message", _MESSAGE), ("error", _ERROR)]))]
)


def _zero(values: pa.Array) -> pa.Array:
    return pc.fill_null(values, 0)


def _per_row(content: pa.Array, flat: pa.Array) -> pa.ListArray:
    """``flat`` (one value per content block) regrouped into one list per row, null where content is null."""
    lengths = _zero(pc.list_value_length(content)).to_numpy(zero_copy_only=False)
    offsets = pa.array([0, *lengths.cumsum().tolist()], pa.int32())
    return pa.ListArray.from_arrays(offsets, flat, mask=pc.is_null(content))


def _tool_inputs(lines: list[bytes], rows: list[int]) -> dict[int, str | None]:
    """The first ``tool_use`` input of each listed row, as JSON text."""
    found: dict[int, str | None] = {}
    for row in rows:
        blocks = ((json.loads(lines[row]).get("result") or {}).get("message") or {}).get("content") or []
        tool = next((b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_use"), None)
        found[row] = (
            None if tool is None else json.dumps(tool.get("input"), ensure_ascii=False, separators=(",", ":"))
        )  # as DuckDB writes it
    return found


_NOT_UTF8 = json.dumps(
    {
        "custom_id": None,
        "result": {
            "type": "unparseable_line",
            "error": {"type": "error", "error": {"type": "unparseable_line", "message": "the line is not valid UTF-8"}},
        },
    }
).encode()


def parse_results_block(block: bytes) -> pa.Table:
    """Result lines -> ANTHROPIC_RAW_SCHEMA rows, column-wise; the per-line path for odd blocks and odd rows."""
    fast = _parse_fast(block)
    return fast if fast is not None else _parse_lines(block)


# The fields of a result line, extracted in one DuckDB pass (see ``jsonl_blocks``). A row whose message has
# more than one content block, or a first block that is neither text nor tool_use, is parsed per line.
_PATHS = [
    "$.custom_id",
    "$.result.type",
    "$.result.message.id",
    "$.result.message.stop_reason",
    "$.result.message.usage.input_tokens",
    "$.result.message.usage.output_tokens",
    "$.result.message.usage.cache_creation_input_tokens",
    "$.result.message.usage.cache_read_input_tokens",
    "$.result.error.error.type",
    "$.result.error.error.message",
    "$.result.message.content[0].type",
    "$.result.message.content[0].text",
    "$.result.message.content[0].input",
    "$.result.message.content[1].type",
]
_EXTRACT_SQL = f"""
SELECT v[1] AS custom_id, v[2] AS kind, v[3] AS message_id, v[4] AS stop_reason,
       TRY_CAST(v[5] AS BIGINT) AS input_tokens, TRY_CAST(v[6] AS BIGINT) AS output_tokens,
       TRY_CAST(v[7] AS BIGINT) AS cache_creation, TRY_CAST(v[8] AS BIGINT) AS cache_read,
       v[9] AS error_type, v[10] AS error_message,
       CASE v[11] WHEN 'text' THEN v[12] WHEN 'tool_use' THEN v[13] END AS text,
       v[2] = 'succeeded' AND (v[14] IS NOT NULL OR v[11] IS NULL OR v[11] NOT IN ('text', 'tool_use'))
         OR v[2] IS NULL AS _odd
FROM (SELECT {json_paths_sql(_PATHS)} AS v FROM lines)
"""


def _parse_fast(block: bytes) -> pa.Table | None:
    """Column-wise parse; None to send the whole block to the per-line path (blank lines, bad UTF-8, a line
    that is not JSON). Odd rows (see ``_PATHS``) are parsed per line and put back in their place."""
    return parse_columnwise(block, _EXTRACT_SQL, _assemble_extracted, _parse_lines)


_TOKEN_COLUMNS = ("input_tokens", "output_tokens", "cache_creation", "cache_read")  # as _assemble takes them


def _assemble_extracted(t: pa.Table, lines: pa.StringArray) -> pa.Table:
    col = t.column
    has_usage = pc.or_(pc.is_valid(col("input_tokens")), pc.is_valid(col("output_tokens")))
    named = (col(name) for name in ("custom_id", "kind", "text", "stop_reason", *_TOKEN_COLUMNS))
    return _assemble(*named, has_usage, col("error_type"), col("error_message"), col("message_id"), lines)


def _parse_lines(block: bytes) -> pa.Table:
    """Line by line: blank lines skipped, Arrow's JSON reader, and ``_loose_line`` when it refuses the block."""
    lines = [line for line in block.split(b"\n") if line.strip()]
    if not lines:
        return empty_table(ANTHROPIC_RAW_SCHEMA)
    t = read_lines(utf8_or_marker(lines, _NOT_UTF8), RESULT_LINE_SCHEMA, _loose_line)
    result = t.column("result").combine_chunks()
    message = pc.struct_field(result, "message")
    inner = pc.struct_field(pc.struct_field(result, "error"), "error")
    usage = pc.struct_field(message, "usage")
    content = pc.struct_field(message, "content")
    # text: the text blocks joined; rows with a tool_use block take its input instead
    blocks = pc.list_flatten(content)
    text = pc.binary_join(_per_row(content, pc.fill_null(pc.struct_field(blocks, "text"), "")), "")
    is_tool = pc.fill_null(pc.equal(pc.struct_field(blocks, "type"), "tool_use"), False)
    tool_rows = sorted(set(pc.filter(pc.list_parent_indices(content), is_tool).to_pylist()))
    if tool_rows:
        inputs = _tool_inputs(lines, tool_rows)
        text = pa.array([inputs[i] if i in inputs else v for i, v in enumerate(text.to_pylist())], _STR)
    return _assemble(
        t.column("custom_id"),
        pc.struct_field(result, "type"),
        text,
        pc.struct_field(message, "stop_reason"),
        pc.struct_field(usage, "input_tokens"),
        pc.struct_field(usage, "output_tokens"),
        pc.struct_field(usage, "cache_creation_input_tokens"),
        pc.struct_field(usage, "cache_read_input_tokens"),
        pc.is_valid(usage),
        pc.struct_field(inner, "type"),
        pc.struct_field(inner, "message"),
        pc.struct_field(message, "id"),
        pa.array([line.decode("utf-8", "replace") for line in lines], _STR),
    )


def _assemble(
    custom_id: Column,
    kind: Column,
    text: Column,
    stop: Column,
    input_tokens: Column,
    output_tokens: Column,
    cache_creation: Column,
    cache_read: Column,
    has_usage: Column,
    error_type: Column,
    error_text: Column,
    message_id: Column,
    raw: Column,
) -> pa.Table:
    """ANTHROPIC_RAW_SCHEMA rows from the fields of result lines, however they were read."""
    succeeded = pc.fill_null(pc.equal(kind, "succeeded"), False)
    status = pc.if_else(
        succeeded,
        pa.scalar(200, pa.int32()),
        pc.if_else(
            pc.equal(kind, "errored"),
            pc.fill_null(lookup(error_type, ERROR_STATUS, pa.int32()), 400),
            pa.scalar(None, pa.int32()),
        ),
    )
    unrun = {k: v[0] for k, v in UNRUN.items()}
    code = pc.if_else(
        succeeded,
        pa.scalar(None, _STR),
        pc.coalesce(error_type, lookup(kind, unrun, _STR), kind, pa.scalar("missing_result", _STR)),
    )
    refused = pc.if_else(
        pc.fill_null(pc.equal(stop, "refusal"), False),
        pa.scalar("refused (stop_reason=refusal)", _STR),
        pa.scalar(None, _STR),
    )
    error_message = pc.coalesce(error_text, lookup(kind, {k: v[1] for k, v in UNRUN.items()}, _STR), refused)
    cache_read, cache_creation = _zero(cache_read), _zero(cache_creation)
    total_input = pc.add(pc.add(input_tokens, cache_read), cache_creation)  # all input: uncached + reads + writes
    return pa.Table.from_arrays(
        [
            one_chunk(custom_id),
            status,
            pc.if_else(succeeded, one_chunk(text), pa.scalar(None, _STR)),
            pc.coalesce(lookup(stop, FINISH_REASONS, _STR), stop),
            total_input,
            pc.if_else(has_usage, cache_read, pa.scalar(None, _INT)),
            output_tokens,
            code,
            error_message,
            message_id,
            raw,
            pc.if_else(has_usage, cache_creation, pa.scalar(None, _INT)),
        ],
        schema=ANTHROPIC_RAW_SCHEMA,
    )


def _loose_line(line: bytes) -> dict[str, Any]:
    """One line the column reader refused: keep what is recognisable, report the rest as an error."""
    try:
        obj = json.loads(line)
        if not isinstance(obj, dict):
            raise ValueError("not an object")
    except ValueError as exc:
        return {
            "custom_id": None,
            "result": {
                "type": "unparseable_line",
                "error": {"type": "error", "error": {"type": "unparseable_line", "message": str(exc)}},
            },
        }
    result = obj.get("result") if isinstance(obj.get("result"), dict) else {}
    message = result.get("message") if isinstance(result.get("message"), dict) else None
    if message is not None:
        blocks = message.get("content") if isinstance(message.get("content"), list) else []
        usage = message.get("usage") if isinstance(message.get("usage"), dict) else {}
        message = {
            "id": message.get("id"),
            "stop_reason": message.get("stop_reason"),
            "usage": {k: v if isinstance(v, int) else None for k, v in usage.items() if k in _USAGE.names},
            "content": [
                {"type": str(b.get("type")), "text": b.get("text") if isinstance(b.get("text"), str) else None}
                for b in blocks
                if isinstance(b, dict)
            ],
        }
    error = result.get("error") if isinstance(result.get("error"), dict) else None
    inner = error.get("error") if error and isinstance(error.get("error"), dict) else None
    return {
        "custom_id": obj.get("custom_id") if isinstance(obj.get("custom_id"), str) else None,
        "result": {
            "type": result.get("type") if isinstance(result.get("type"), str) else None,
            "message": message,
            "error": None
            if inner is None
            else {"type": "error", "error": {"type": str(inner.get("type")), "message": str(inner.get("message"))}},
        },
    }
