"""Bedrock batch records for Claude: input lines ``{"recordId", "modelInput"}`` and ``.jsonl.out`` lines parsed
column-wise.

``modelInput`` is the Bedrock Messages body: the Anthropic request of ``executors/anthropic/format.py`` (the same
limits, sampling, system and forced ``answer`` tool that carries the output contract) without ``model`` (the job
names it), with ``anthropic_version: bedrock-2023-05-31``, and without ``cache_control`` (batch inference bills no
cache writes, and not every Claude on Bedrock accepts the field). An output line is
``{"recordId", "modelInput", "modelOutput": <InvokeModel body>}`` or ``{"recordId", "modelInput", "error":
{"errorCode": <HTTP status>, "errorMessage"}}``; ``raw_payload`` keeps it verbatim.
"""

import json
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from batch_pipeline.core.errors import ConfigError
from batch_pipeline.core.ledger.executor import RequestPlan, ShardWork
from batch_pipeline.core.store import empty_table
from batch_pipeline.executors.anthropic.format import ANTHROPIC_RAW_SCHEMA, FINISH_REASONS
from batch_pipeline.executors.anthropic.request_format import shared_params
from batch_pipeline.executors.jsonl_blocks import json_paths_sql, lookup, one_chunk, parse_columnwise

ANTHROPIC_VERSION = "bedrock-2023-05-31"
BEDROCK_RAW_SCHEMA = ANTHROPIC_RAW_SCHEMA  # the raw columns, then the cache writes
# errorCode (an HTTP status) -> the exception Bedrock names for it; the status decides the error class
ERROR_NAMES = {
    400: "ValidationException",
    403: "AccessDeniedException",
    404: "ResourceNotFoundException",
    408: "ModelTimeoutException",
    424: "ModelErrorException",
    429: "ThrottlingException",
    500: "InternalServerException",
    503: "ServiceUnavailableException",
}
REFUSED = "refused (stop_reason=refusal)"
_STR, _INT = pa.string(), pa.int64()


def is_claude(model: str) -> bool:
    """Anthropic models on Bedrock: ``anthropic.claude-...``, inference profiles ``us.anthropic...``, their ARNs."""
    return "anthropic." in model


def model_input_frame(plan: RequestPlan) -> dict[str, Any]:
    """Everything in ``modelInput`` except the messages."""
    if not is_claude(plan.model):
        raise ConfigError(
            f"model {plan.model!r}: bedrock_batch sends the Bedrock Messages body, which only "
            "Anthropic Claude models take (anthropic.claude-..., or an inference profile such as "
            "us.anthropic.claude-...)"
        )
    params = shared_params(plan)
    params.pop("model")
    if "system" in params:
        params["system"] = plan.system  # a plain string: no cache_control breakpoint
    return {"anthropic_version": ANTHROPIC_VERSION, **params}


def request_lines(work: ShardWork) -> bytes:
    """The shard's input JSONL: one ``{"recordId": request_id, "modelInput": {...}}`` per item."""
    frame = json.dumps(model_input_frame(work.plan), ensure_ascii=False, separators=(",", ":"))
    model_input = frame[:-1] + ',"messages":[' + work.plan.examples_json()  # the examples, then the item's turns
    # request IDs are hex digests: quoted as they are, as in every provider's file (column-wise, RequestPlan)
    return work.plan.request_lines('{"recordId":"', '","modelInput":' + model_input, "]}}", work.items)


def parse_output_block(block: bytes) -> pa.Table:
    """``.jsonl.out`` lines -> BEDROCK_RAW_SCHEMA rows: column-wise in DuckDB, per line for odd blocks and rows."""
    fast = parse_columnwise(block, _EXTRACT_SQL, _assemble_extracted, _parse_lines)
    return fast if fast is not None else _parse_lines(block)


_PATHS = [
    "$.recordId",
    "$.modelOutput.id",
    "$.modelOutput.stop_reason",
    "$.modelOutput.usage.input_tokens",
    "$.modelOutput.usage.output_tokens",
    "$.modelOutput.usage.cache_creation_input_tokens",
    "$.modelOutput.usage.cache_read_input_tokens",
    "$.error.errorCode",
    "$.error.errorMessage",
    "$.modelOutput.content[0].type",
    "$.modelOutput.content[0].text",
    "$.modelOutput.content[0].input",
    "$.modelOutput.content[1].type",
    "$.modelOutput.type",
]
# A row is odd (parsed per line) when it has neither a recognisable modelOutput nor an error code, when its
# message has more than one content block or a first block that is neither text nor tool_use, or when its
# errorCode is not an integer.
_EXTRACT_SQL = f"""
SELECT v[1] AS record_id, v[2] AS message_id, v[3] AS stop_reason,
       TRY_CAST(v[4] AS BIGINT) AS input_tokens, TRY_CAST(v[5] AS BIGINT) AS output_tokens,
       TRY_CAST(v[6] AS BIGINT) AS cache_creation, TRY_CAST(v[7] AS BIGINT) AS cache_read,
       TRY_CAST(v[8] AS INTEGER) AS error_code, v[9] AS error_message,
       CASE v[10] WHEN 'text' THEN v[11] WHEN 'tool_use' THEN v[12] END AS text,
       v[14] = 'message' AS ok,
       (v[14] IS DISTINCT FROM 'message' AND TRY_CAST(v[8] AS INTEGER) IS NULL)
         OR (v[14] = 'message' AND (v[13] IS NOT NULL OR v[10] IS NULL OR v[10] NOT IN ('text', 'tool_use')))
         AS _odd
FROM (SELECT {json_paths_sql(_PATHS)} AS v FROM lines)
"""


def _assemble_extracted(t: pa.Table, lines: pa.StringArray) -> pa.Table:
    return _assemble_columns(t.column, pc.fill_null(t.column("ok"), False), lines)


def _line_row(raw: bytes) -> dict[str, Any]:
    """One line, however odd: what is recognisable, else an ``unparseable_line`` error."""
    text = raw.decode("utf-8", "replace")
    row: dict[str, Any] = {
        "record_id": None,
        "ok": False,
        "text": None,
        "stop_reason": None,
        "input_tokens": None,
        "output_tokens": None,
        "cache_creation": None,
        "cache_read": None,
        "error_code": None,
        "error_message": None,
        "message_id": None,
        "raw": text,
    }
    try:
        obj = json.loads(raw)
        if not isinstance(obj, dict):
            raise ValueError("not an object")
    except ValueError as exc:
        return {**row, "error_message": f"unparseable line: {exc}"}
    row["record_id"] = obj.get("recordId") if isinstance(obj.get("recordId"), str) else None
    output, error = obj.get("modelOutput"), obj.get("error")
    if isinstance(output, dict):
        usage = output.get("usage") if isinstance(output.get("usage"), dict) else {}
        blocks = [b for b in output.get("content") or [] if isinstance(b, dict)]
        tool = next((b for b in blocks if b.get("type") == "tool_use"), None)
        answer = (
            json.dumps(tool.get("input"), ensure_ascii=False, separators=(",", ":"))
            if tool is not None
            else "".join(b.get("text") or "" for b in blocks if isinstance(b.get("text"), str))
        )
        number = {
            k: usage.get(k) if isinstance(usage.get(k), int) else None
            for k in ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
        }
        return {
            **row,
            "ok": True,
            "text": answer,
            "stop_reason": output.get("stop_reason"),
            "input_tokens": number["input_tokens"],
            "output_tokens": number["output_tokens"],
            "cache_creation": number["cache_creation_input_tokens"],
            "cache_read": number["cache_read_input_tokens"],
            "message_id": output.get("id") if isinstance(output.get("id"), str) else None,
        }
    if isinstance(error, dict):
        code = error.get("errorCode")
        try:
            status = int(code) if code is not None and not isinstance(code, bool) else None
        except (TypeError, ValueError):
            status = None
        return {**row, "error_code": status, "error_message": str(error.get("errorMessage") or code or "")}
    return {**row, "error_message": "the line has neither modelOutput nor error"}


_LINE_SCHEMA = pa.schema(
    [
        ("record_id", _STR),
        ("ok", pa.bool_()),
        ("text", _STR),
        ("stop_reason", _STR),
        ("input_tokens", _INT),
        ("output_tokens", _INT),
        ("cache_creation", _INT),
        ("cache_read", _INT),
        ("error_code", pa.int32()),
        ("error_message", _STR),
        ("message_id", _STR),
        ("raw", _STR),
    ]
)


def _parse_lines(block: bytes) -> pa.Table:
    rows = [_line_row(line) for line in block.split(b"\n") if line.strip()]
    if not rows:
        return empty_table(BEDROCK_RAW_SCHEMA)
    t = pa.Table.from_pylist(rows, schema=_LINE_SCHEMA)
    return _assemble_columns(t.column, t.column("ok"), t.column("raw"))


def _assemble_columns(col: Any, ok: Any, raw: Any) -> pa.Table:
    """``_assemble`` of the named columns both paths extract (DuckDB's and the per-line one)."""
    tokens = (col(name) for name in ("input_tokens", "output_tokens", "cache_creation", "cache_read"))
    return _assemble(col("record_id"), ok, col("text"), col("stop_reason"), *tokens, *map(col, _ERROR_COLUMNS), raw)


_ERROR_COLUMNS = ("error_code", "error_message", "message_id")  # as _assemble takes them


def _assemble(
    record_id: Any,
    ok: Any,
    text: Any,
    stop: Any,
    input_tokens: Any,
    output_tokens: Any,
    cache_creation: Any,
    cache_read: Any,
    error_code: Any,
    error_text: Any,
    message_id: Any,
    raw: Any,
) -> pa.Table:
    """BEDROCK_RAW_SCHEMA rows from the fields of output lines, however they were read."""
    ok = pc.fill_null(ok, False)
    error_code = pc.cast(error_code, pa.int32())
    status = pc.if_else(ok, pa.scalar(200, pa.int32()), error_code)
    name = pc.coalesce(
        lookup(error_code, ERROR_NAMES, _STR, pa.int32()),
        pc.if_else(pc.is_valid(error_code), pa.scalar("bedrock_error", _STR), pa.scalar("unparseable_line", _STR)),
    )
    refused = pc.if_else(
        pc.fill_null(pc.equal(stop, "refusal"), False), pa.scalar(REFUSED, _STR), pa.scalar(None, _STR)
    )
    has_usage = pc.and_(ok, pc.or_(pc.is_valid(input_tokens), pc.is_valid(output_tokens)))
    cache_read, cache_creation = pc.fill_null(cache_read, 0), pc.fill_null(cache_creation, 0)
    return pa.Table.from_arrays(
        [
            one_chunk(record_id),
            one_chunk(status),
            one_chunk(pc.if_else(ok, text, pa.scalar(None, _STR))),
            one_chunk(pc.coalesce(lookup(stop, FINISH_REASONS, _STR), stop)),
            one_chunk(
                pc.if_else(has_usage, pc.add(pc.add(input_tokens, cache_read), cache_creation), pa.scalar(None, _INT))
            ),
            one_chunk(pc.if_else(has_usage, cache_read, pa.scalar(None, _INT))),
            one_chunk(pc.if_else(ok, output_tokens, pa.scalar(None, _INT))),
            one_chunk(pc.if_else(ok, pa.scalar(None, _STR), name)),
            one_chunk(pc.if_else(ok, refused, error_text)),
            one_chunk(message_id),
            one_chunk(raw),
            one_chunk(pc.if_else(has_usage, cache_creation, pa.scalar(None, _INT))),
        ],
        schema=BEDROCK_RAW_SCHEMA,
    )
