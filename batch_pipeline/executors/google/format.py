"""Gemini's ``GenerateContent`` format, both ways: request bodies out, response objects in (column-wise).

Shared by every Google batch backend: the Developer API's batch files (``{"key", "response" | "error"}``) and
Vertex AI's prediction files carry the same ``GenerateContentRequest`` / ``GenerateContentResponse`` objects,
only wrapped differently. A ``LineLayout`` says where a line keeps its request ID, its response and its error, so
this module knows nothing of either wrapper.

Requests: the system prompt as ``systemInstruction``; a choice or JSON-schema contract as
``responseMimeType: application/json`` + ``responseJsonSchema`` (a choice is ``{"label": ...}``, which the
validator accepts, as on Anthropic); ``maxOutputTokens``, ``temperature``, ``topP``, ``seed``.

Responses -> ``RAW_RESULT_SCHEMA`` rows:

- text: the candidate's non-thought parts joined; null for a refusal (its partial text is not an answer);
- finish_reason: ``STOP`` -> ``stop``, ``MAX_TOKENS`` -> ``length`` (the validator's truncation), the safety,
  recitation, blocklist ... reasons and a blocked prompt (``promptFeedback.blockReason``, no candidate) ->
  ``refusal``; anything else lower-cased;
- usage: ``input_tokens`` = ``promptTokenCount`` (it includes the cached prefix), ``cached_tokens`` =
  ``cachedContentTokenCount``, ``output_tokens`` = ``candidatesTokenCount`` + ``thoughtsTokenCount`` (thinking
  is billed as output);
- a per-request error (a ``google.rpc.Status``: ``code``, ``message``, ``details``): its RPC ``code`` (3, 13,
  ...) as the HTTP status the same error has online (``RPC_CODES``; a code of 100 or more is taken as HTTP
  already), ``error_code`` from an ``ErrorInfo`` reason that means "a human must act" (``SYSTEMIC_REASONS``),
  else the code's name lower-cased (``invalid_argument``, ``internal``, ...).

The common rows are read in one DuckDB pass (see ``jsonl_blocks``); odd rows (several parts, a thought part,
error details) and odd blocks go through ``json.loads`` line by line.
"""

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from batch_pipeline.core.error_table import Family, reason_stops
from batch_pipeline.core.ledger.executor import RAW_RESULT_SCHEMA, ItemShape, RequestPlan
from batch_pipeline.executors.jsonl_blocks import RESULT_BLOCK_BYTES, json_paths_sql, parse_columnwise, parse_stream
from batch_pipeline.executors.output_contract import output_schema

JSON_MIME = "application/json"
GEMINI_ROLES = {"user": "user", "assistant": "model"}  # a Content's role: the model's own turns are "model"
FINISH_REASONS = {"STOP": "stop", "MAX_TOKENS": "length"}
REFUSAL_REASONS = frozenset(
    {
        "SAFETY",
        "RECITATION",
        "BLOCKLIST",
        "PROHIBITED_CONTENT",
        "SPII",
        "LANGUAGE",
        "IMAGE_SAFETY",
        "IMAGE_PROHIBITED_CONTENT",
        "IMAGE_RECITATION",
    }
)
# google.rpc.ErrorInfo reasons that no retry can fix -> our systemic codes: the error table's rows
# (core/error_table.py), so a failed line carries the same code the same answer to a call stops with
SYSTEMIC_REASONS = reason_stops(Family.GEMINI)
ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"
# google.rpc.Code -> (name, the HTTP status the same error has online); a Status in a line carries the number
RPC_CODES = {
    1: ("CANCELLED", 499),
    2: ("UNKNOWN", 500),
    3: ("INVALID_ARGUMENT", 400),
    4: ("DEADLINE_EXCEEDED", 504),
    5: ("NOT_FOUND", 404),
    6: ("ALREADY_EXISTS", 409),
    7: ("PERMISSION_DENIED", 403),
    8: ("RESOURCE_EXHAUSTED", 429),
    9: ("FAILED_PRECONDITION", 400),
    10: ("ABORTED", 409),
    11: ("OUT_OF_RANGE", 400),
    12: ("UNIMPLEMENTED", 501),
    13: ("INTERNAL", 500),
    14: ("UNAVAILABLE", 503),
    15: ("DATA_LOSS", 500),
    16: ("UNAUTHENTICATED", 401),
}


# -- requests -------------------------------------------------------------------------------------------------
def request_template(plan: RequestPlan) -> dict[str, Any]:
    """Everything of a ``GenerateContentRequest`` except ``contents``: the same for every request of a job."""
    sampling = plan.sampling
    config: dict[str, Any] = {"temperature": sampling.temperature, "maxOutputTokens": sampling.max_tokens}
    if sampling.top_p is not None:
        config["topP"] = sampling.top_p
    if sampling.seed is not None:
        config["seed"] = sampling.seed
    schema = output_schema(plan)
    if schema is not None:
        config["responseMimeType"] = JSON_MIME
        config["responseJsonSchema"] = schema
    template: dict[str, Any] = {}
    if plan.system:
        template["systemInstruction"] = {"parts": [{"text": plan.system}]}
    template["generationConfig"] = config
    return template


def _content(role: str, text: str) -> dict[str, Any]:
    return {"role": GEMINI_ROLES[role], "parts": [{"text": text}]}


def contents(plan: RequestPlan, user_prompt: str) -> list[dict[str, Any]]:
    """The request's ``contents``: the few-shot examples, then the item's turns (``assistant`` is ``model``)."""
    return [_content(t["role"], t["content"]) for t in plan.turns(user_prompt)]


def contents_writer(plan: RequestPlan) -> Callable[[str], str]:
    """user_prompt -> its ``contents`` array as compact JSON text; the examples are serialised once, so they are
    byte-identical in every request."""
    head = "".join(_dumps(_content(role, text)) + "," for role, text in plan.examples)
    if plan.shape is ItemShape.TEXT:
        return lambda prompt: f'[{head}{{"role":"user","parts":[{{"text":{json.dumps(prompt, ensure_ascii=False)}}}]}}]'
    row_turns = plan.row_turns
    return lambda prompt: (
        "[" + head + ",".join(_dumps(_content(t["role"], t["content"])) for t in row_turns(prompt)) + "]"
    )


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def generate_content_request(plan: RequestPlan, user_prompt: str) -> dict[str, Any]:
    """The ``GenerateContentRequest`` body (REST field names) for one prompt."""
    return {"contents": contents(plan, user_prompt), **request_template(plan)}


# -- responses ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LineLayout:
    """Where a result line keeps its request ID, its ``GenerateContentResponse`` and its ``google.rpc.Status``
    error (JSON paths from the line's root, ``$.a.b`` form; ``$`` alone is not allowed)."""

    key: str = "$.key"
    response: str = "$.response"
    error: str = "$.error"

    def __post_init__(self) -> None:
        for path in (self.key, self.response, self.error):
            if not path.startswith("$.") or "'" in path:
                raise ValueError(f"layout path {path!r} must look like $.field")

    def get(self, obj: Any, path: str) -> Any:
        for name in path[2:].split("."):
            obj = obj.get(name) if isinstance(obj, dict) else None
        return obj


def _sql(layout: LineLayout) -> str:
    r, e = layout.response, layout.error
    paths = [
        layout.key,
        f"{r}.candidates[0].content.parts[0].text",
        f"{r}.candidates[0].content.parts[1]",
        f"{r}.candidates[0].content.parts[0].thought",
        f"{r}.candidates[0].finishReason",
        f"{r}.usageMetadata.promptTokenCount",
        f"{r}.usageMetadata.cachedContentTokenCount",
        f"{r}.usageMetadata.candidatesTokenCount",
        f"{r}.usageMetadata.thoughtsTokenCount",
        f"{r}.responseId",
        f"{r}.promptFeedback.blockReason",
        f"{e}.code",
        f"{e}.status",
        f"{e}.message",
        f"{e}.details",
    ]  # no whole objects: each is re-serialised
    refusals = ", ".join(f"'{x}'" for x in sorted(REFUSAL_REASONS))
    rpc_http = " ".join(f"WHEN {n} THEN {h}" for n, (_, h) in RPC_CODES.items())
    rpc_name = " ".join(f"WHEN {n} THEN '{name.lower()}'" for n, (name, _) in RPC_CODES.items())
    return f"""
SELECT request_id,
       CASE WHEN has_error THEN CASE WHEN code >= 100 THEN code ELSE CASE code {rpc_http} ELSE 500 END END
            WHEN has_response THEN 200 END::INTEGER AS http_status,
       CASE WHEN has_response AND NOT has_error AND NOT refused THEN text END AS output_text,
       CASE WHEN NOT has_response OR has_error THEN NULL WHEN refused THEN 'refusal'
            WHEN finish = 'STOP' THEN 'stop' WHEN finish = 'MAX_TOKENS' THEN 'length' ELSE lower(finish) END
         AS finish_reason,
       CASE WHEN has_usage THEN coalesce(prompt, 0) END AS input_tokens,
       CASE WHEN has_usage THEN coalesce(cached, 0) END AS cached_tokens,
       CASE WHEN has_usage THEN coalesce(candidates, 0) + coalesce(thoughts, 0) END AS output_tokens,
       CASE WHEN has_error THEN coalesce(lower(status), CASE code {rpc_name} END,
                                         'http_' || coalesce(code::VARCHAR, '500'))
            WHEN NOT has_response THEN 'missing_result' END AS error_code,
       CASE WHEN has_error THEN message
            WHEN NOT has_response THEN 'the result line has neither a response nor an error'
            WHEN block IS NOT NULL THEN 'prompt blocked (blockReason=' || block || ')'
            WHEN refused THEN 'refused (finishReason=' || finish || ')' END AS error_message,
       response_id AS provider_request_id,
       request_id IS NULL OR (has_error AND details IS NOT NULL) OR NOT (has_error OR has_response)
         OR (has_response AND NOT has_error AND (part1 IS NOT NULL OR thought IS NOT DISTINCT FROM 'true'))
         AS _odd
FROM (
  SELECT v[1] AS request_id, v[2] AS text, v[3] AS part1, v[4] AS thought, v[5] AS finish,
         TRY_CAST(v[6] AS BIGINT) AS prompt, TRY_CAST(v[7] AS BIGINT) AS cached,
         TRY_CAST(v[8] AS BIGINT) AS candidates, TRY_CAST(v[9] AS BIGINT) AS thoughts, v[10] AS response_id,
         v[11] AS block, TRY_CAST(v[12] AS INTEGER) AS code, v[13] AS status, v[14] AS message, v[15] AS details,
         v[6] IS NOT NULL OR v[7] IS NOT NULL OR v[8] IS NOT NULL OR v[9] IS NOT NULL AS has_usage,
         v[12] IS NOT NULL OR v[14] IS NOT NULL AS has_error,
         v[12] IS NULL AND v[14] IS NULL AND (v[2] IS NOT NULL OR v[5] IS NOT NULL OR v[6] IS NOT NULL
                                             OR v[10] IS NOT NULL OR v[11] IS NOT NULL) AS has_response,
         v[11] IS NOT NULL OR v[5] IN ({refusals}) AS refused
  FROM (SELECT {json_paths_sql(paths)} AS v FROM lines))
"""


_SQL_CACHE: dict[LineLayout, str] = {}


def parse_block(block: bytes, layout: LineLayout = LineLayout()) -> pa.Table:
    """Result lines -> RAW_RESULT_SCHEMA rows, column-wise; the per-line path for odd rows and odd blocks."""
    sql = _SQL_CACHE.get(layout)
    if sql is None:
        sql = _SQL_CACHE[layout] = _sql(layout)
    fast = parse_columnwise(block, sql, _with_raw_lines, lambda odd: parse_lines(odd, layout))
    return fast if fast is not None else parse_lines(block, layout)


def _with_raw_lines(t: pa.Table, lines: pa.StringArray) -> pa.Table:
    return pa.Table.from_arrays([*t.drop_columns(["_odd"]).columns, lines], schema=RAW_RESULT_SCHEMA)


def parse_result_stream(
    chunks: Iterable[bytes], workers: int = 1, layout: LineLayout = LineLayout(), block_bytes: int = RESULT_BLOCK_BYTES
) -> Iterator[pa.Table]:
    """A downloaded result file, as byte chunks -> RAW_RESULT_SCHEMA tables in file order (parsed on ``workers``
    threads while the next blocks arrive)."""
    return parse_stream(lambda block: parse_block(block, layout), chunks, workers, block_bytes)


def parse_lines(block: bytes, layout: LineLayout = LineLayout()) -> pa.Table:
    """Line by line with ``json.loads``: blank lines skipped, a line that is not JSON becomes an error row."""
    rows = [_row(line, layout) for line in block.split(b"\n") if line.strip()]
    columns = list(zip(*rows)) if rows else [[] for _ in RAW_RESULT_SCHEMA]
    return pa.Table.from_arrays(
        [pa.array(c, f.type) for c, f in zip(columns, RAW_RESULT_SCHEMA, strict=True)], schema=RAW_RESULT_SCHEMA
    )


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():  # int64 fields may arrive as JSON strings
        return int(value)
    return None


def _row(line: bytes, layout: LineLayout) -> tuple[Any, ...]:
    raw = line.decode("utf-8", "replace")
    try:
        line.decode("utf-8")
        obj = json.loads(line)
        if not isinstance(obj, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        return (None, None, None, None, None, None, None, "unparseable_line", str(exc)[:500], None, raw)
    key = layout.get(obj, layout.key)
    key = key if isinstance(key, str) else None
    response, error = layout.get(obj, layout.response), layout.get(obj, layout.error)
    if isinstance(error, dict):
        return (key, *error_columns(error), None, raw)
    if not isinstance(response, dict):
        return missing_result(key, "the result line has neither a response nor an error", raw)
    return (key, *response_columns(response), raw)


def error_columns(error: dict[str, Any]) -> tuple[Any, ...]:
    """(http_status, output_text, finish_reason, input, cached, output tokens, error_code, error_message) of a
    ``google.rpc.Status``."""
    code = _int(error.get("code"))
    name, http = RPC_CODES.get(code or 0, (None, 500))
    http = code if code is not None and code >= 100 else http
    status = error.get("status") if isinstance(error.get("status"), str) else name
    details = error.get("details") if isinstance(error.get("details"), list) else []
    reason = next((d.get("reason") for d in details if isinstance(d, dict) and d.get("@type") == ERROR_INFO), None)
    error_code = SYSTEMIC_REASONS.get(reason) if isinstance(reason, str) else None
    error_code = error_code or (status.lower() if status else f"http_{code if code is not None else 500}")
    message = error.get("message") if isinstance(error.get("message"), str) else None
    return (http, None, None, None, None, None, error_code, message)


_TOKEN_FIELDS = ("promptTokenCount", "cachedContentTokenCount", "candidatesTokenCount", "thoughtsTokenCount")


def response_columns(response: dict[str, Any]) -> tuple[Any, ...]:
    """(http_status ... provider_request_id) of one ``GenerateContentResponse`` object (REST field names)."""
    candidates = response.get("candidates") if isinstance(response.get("candidates"), list) else []
    first = candidates[0] if candidates and isinstance(candidates[0], dict) else {}
    parts = (first.get("content") or {}).get("parts") if isinstance(first.get("content"), dict) else None
    texts = [
        p["text"]
        for p in parts or []
        if isinstance(p, dict) and isinstance(p.get("text"), str) and not p.get("thought")
    ]
    finish = first.get("finishReason") if isinstance(first.get("finishReason"), str) else None
    feedback = response.get("promptFeedback") if isinstance(response.get("promptFeedback"), dict) else {}
    block = feedback.get("blockReason") if isinstance(feedback.get("blockReason"), str) else None
    refused = block is not None or finish in REFUSAL_REASONS
    usage = response.get("usageMetadata") if isinstance(response.get("usageMetadata"), dict) else {}
    tokens: tuple[int | None, int | None, int | None] = (None, None, None)
    if any(_int(usage.get(k)) is not None for k in _TOKEN_FIELDS):
        tokens = (
            _int(usage.get("promptTokenCount")) or 0,
            _int(usage.get("cachedContentTokenCount")) or 0,
            (_int(usage.get("candidatesTokenCount")) or 0) + (_int(usage.get("thoughtsTokenCount")) or 0),
        )
    if refused:
        reason = "refusal"
        message = f"prompt blocked (blockReason={block})" if block else f"refused (finishReason={finish})"
    else:
        reason = FINISH_REASONS.get(finish, finish.lower()) if finish else None
        message = None
    text = "".join(texts) if texts and not refused else None
    response_id = response.get("responseId") if isinstance(response.get("responseId"), str) else None
    return (200, text, reason, *tokens, None, message, response_id)


def missing_result(key: str | None, message: str, raw: str) -> tuple[Any, ...]:
    """The row of a line that answers nothing (neither a response nor an error): ``missing_result``, line kept."""
    return (key, None, None, None, None, None, None, "missing_result", message, None, raw)
