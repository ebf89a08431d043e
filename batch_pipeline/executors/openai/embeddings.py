"""The OpenAI embeddings request, both ways: batch lines (``url: /v1/embeddings``) and bodies out, vectors in.

Every request asks for ``output.embedding.dimensions`` values as ``encoding_format: base64`` (little-endian
float32, the bytes the model produced: a quarter of the size of decimal floats, and a NaN or an infinity
survives the trip, where JSON has no spelling for them). A list of floats is read too (a provider or a server
that ignores the encoding). Result lines come back as ``RAW_RESULT_SCHEMA`` columns plus ``embedding``
(list of float32; null where there is no vector): no output text, no output tokens, input tokens from
``usage.prompt_tokens``.
"""

import base64
import binascii
import json
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from batch_pipeline.core.errors import ConfigError
from batch_pipeline.core.ledger.executor import (
    RAW_OPTIONAL_SCHEMA,
    RAW_RESULT_SCHEMA,
    RequestPlan,
    ShardWork,
)
from batch_pipeline.executors.jsonl_blocks import (
    RESULT_BLOCK_BYTES,
    extract_block,
    json_paths_sql,
    parse_stream,
)

EMBEDDINGS_URL = "/v1/embeddings"
ENCODING = "base64"
EMBEDDING_FIELD = RAW_OPTIONAL_SCHEMA.field("embedding")
EMBEDDING_RAW_SCHEMA = pa.schema([*RAW_RESULT_SCHEMA, EMBEDDING_FIELD])


def is_embedding(plan: RequestPlan) -> bool:
    return plan.output.embedding is not None


def embedding_body(plan: RequestPlan, model: str | None = None) -> dict[str, Any]:
    """Everything in an embeddings body except ``input``."""
    if plan.output.embedding is None:
        raise ValueError("not an embeddings job")
    if getattr(plan, "shape", "text") != "text":  # ItemShape.TURNS: a row's chat turns
        raise ConfigError("an embeddings job embeds one text per row (input.text_field), not chat turns")
    return {"model": model or plan.model, "dimensions": plan.output.embedding.dimensions, "encoding_format": ENCODING}


def embedding_request_lines(work: ShardWork, url: str = EMBEDDINGS_URL, model: str | None = None) -> bytes:
    """The batch input file of an embeddings shard; the shared part of each line is serialised once."""
    settings = json.dumps(embedding_body(work.plan, model), ensure_ascii=False, separators=(",", ":"))[1:-1]
    head = '{"custom_id":"'
    mid = f'","method":"POST","url":"{url}","body":{{{settings},"input":'
    dumps = json.dumps
    lines = [
        f"{head}{rid}{mid}{dumps(text, ensure_ascii=False)}}}}}"
        for rid, text in zip(work.items.column("request_id").to_pylist(), work.items.column("user_prompt").to_pylist())
    ]
    return ("\n".join(lines) + "\n").encode("utf-8")


def decode_vector(value: Any) -> np.ndarray | None:
    """One ``data[].embedding``: base64 of little-endian float32, or a list of numbers; None if it is neither."""
    if value is None:
        return None
    if isinstance(value, list):
        try:
            return np.asarray(value, dtype=np.float32)
        except (TypeError, ValueError):
            return None
    if not isinstance(value, str):
        return None
    if value.startswith("["):
        try:
            return decode_vector(json.loads(value))
        except ValueError:
            return None
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None
    if len(raw) % 4:
        return None
    return np.frombuffer(raw, dtype="<f4")


def vectors_array(vectors: list[np.ndarray | None]) -> pa.Array:
    """Decoded vectors as one list<float32> array (one buffer, offsets; null where there was none)."""
    lengths = np.fromiter((0 if v is None else len(v) for v in vectors), dtype=np.int64, count=len(vectors))
    offsets = np.zeros(len(vectors) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    present = [v for v in vectors if v is not None]
    flat = np.concatenate(present).astype(np.float32, copy=False) if present else np.zeros(0, np.float32)
    mask = pa.array([v is None for v in vectors], pa.bool_())
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(flat, pa.float32()), mask=mask)


# The fields of a result line as JSON paths, extracted in one DuckDB pass (as for chat lines, see format.py)
_PATHS = [
    "$.custom_id",
    "$.response.status_code",
    "$.response.body.data[0].embedding",
    "$.response.body.usage.prompt_tokens",
    "$.error.code",
    "$.response.body.error.code",
    "$.response.body.error.type",
    "$.error.message",
    "$.response.body.error.message",
    "$.response.request_id",
]
_SQL = f"""
SELECT v[1] AS request_id, TRY_CAST(v[2] AS INTEGER) AS http_status, v[3] AS vector,
       TRY_CAST(v[4] AS BIGINT) AS input_tokens, coalesce(v[5], v[6], v[7]) AS error_code,
       coalesce(v[8], v[9]) AS error_message, v[10] AS provider_request_id,
       v[1] IS NULL AND v[2] IS NULL AND v[5] IS NULL AND v[8] IS NULL AND v[10] IS NULL AS _blank
FROM (SELECT {json_paths_sql(_PATHS)} AS v FROM lines)
"""


def _table(ids, status, vectors, tokens, codes, messages, provider_ids, lines) -> pa.Table:
    answered = [s == 200 and v is not None for s, v in zip(status, vectors)]
    codes = [
        c if c is not None or s != 200 or v is not None else "unparseable_response"
        for c, s, v in zip(codes, status, vectors)
    ]
    messages = [
        m if m is not None or s != 200 or v is not None else "the 200 response carries no embedding"
        for m, s, v in zip(messages, status, vectors)
    ]
    zero = [0 if a else None for a in answered]
    return embedding_table(ids, status, tokens, zero, codes, messages, provider_ids, lines, vectors)


def embedding_table(
    ids: list[Any],
    status: list[Any],
    tokens: list[Any],
    zero: list[Any],
    codes: list[Any],
    messages: list[Any],
    provider_ids: list[Any] | None,
    lines: list[Any],
    vectors: list[Any],
) -> pa.Table:
    """``EMBEDDING_RAW_SCHEMA`` rows from their columns, for every embeddings format: no output text or finish
    reason; ``zero`` (0 for an answered row, else null) stands for the cached and output tokens."""
    n = len(ids)
    return pa.Table.from_arrays(
        [
            pa.array(ids, pa.string()),
            pa.array(status, pa.int32()),
            pa.nulls(n, pa.string()),
            pa.nulls(n, pa.string()),
            pa.array(tokens, pa.int64()),
            pa.array(zero, pa.int64()),
            pa.array(zero, pa.int64()),
            pa.array(codes, pa.string()),
            pa.array(messages, pa.string()),
            pa.array(provider_ids, pa.string()) if provider_ids is not None else pa.nulls(n, pa.string()),
            pa.array(lines, pa.string()),
            vectors_array(vectors),
        ],
        schema=EMBEDDING_RAW_SCHEMA,
    )


def parse_embedding_block(block: bytes) -> pa.Table:
    """Output or error file lines of an embeddings batch -> ``EMBEDDING_RAW_SCHEMA`` rows."""
    read = extract_block(block, _SQL)
    if read is not None and not any(read[1].column("_blank").to_pylist()):
        lines, t = read
        c = {name: t.column(name).to_pylist() for name in t.column_names}
        return _table(
            c["request_id"],
            c["http_status"],
            [decode_vector(v) for v in c["vector"]],
            c["input_tokens"],
            c["error_code"],
            c["error_message"],
            c["provider_request_id"],
            lines.to_pylist(),
        )
    return _parse_lines(block)


def _parse_lines(block: bytes) -> pa.Table:
    """Line by line (Python's JSON reader, which also takes NaN): what the column path refused."""
    rows = [_line(raw) for raw in block.split(b"\n") if raw.strip()]
    cols = list(zip(*rows)) if rows else [[] for _ in range(8)]
    return _table(*cols)


def _line(raw: bytes) -> tuple:
    text = raw.decode("utf-8", "replace")
    try:
        obj = json.loads(text)
    except ValueError as exc:
        return None, None, None, None, "unparseable_line", str(exc)[:300], None, text
    if not isinstance(obj, dict):
        return None, None, None, None, "unparseable_line", "the line is not a JSON object", None, text
    resp = obj.get("response") if isinstance(obj.get("response"), dict) else {}
    body = resp.get("body") if isinstance(resp.get("body"), dict) else {}
    line_err = obj.get("error") if isinstance(obj.get("error"), dict) else {}
    body_err = body.get("error") if isinstance(body.get("error"), dict) else {}
    data = body.get("data") if isinstance(body.get("data"), list) else []
    first = data[0] if data and isinstance(data[0], dict) else {}
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    status = resp.get("status_code") if isinstance(resp.get("status_code"), int) else None
    tokens = usage.get("prompt_tokens") if isinstance(usage.get("prompt_tokens"), int) else None
    return (
        obj.get("custom_id"),
        status,
        decode_vector(first.get("embedding")),
        tokens,
        line_err.get("code") or body_err.get("code") or body_err.get("type"),
        line_err.get("message") or body_err.get("message"),
        resp.get("request_id"),
        text,
    )


def parse_embedding_stream(
    chunks: Iterable[bytes], workers: int = 1, block_bytes: int = RESULT_BLOCK_BYTES, total_bytes: int | None = None
) -> Iterator[pa.Table]:
    """A downloaded output or error file of an embeddings batch -> one table per block, in file order."""
    return parse_stream(parse_embedding_block, chunks, workers, block_bytes, total_bytes)


def embedding_from_response(body: dict[str, Any]) -> tuple[np.ndarray | None, int | None]:
    """(the vector, the prompt tokens) of a ``CreateEmbeddingResponse`` body (online)."""
    data = body.get("data") if isinstance(body.get("data"), list) else []
    first = data[0] if data and isinstance(data[0], dict) else {}
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    tokens = usage.get("prompt_tokens")
    return decode_vector(first.get("embedding")), tokens if isinstance(tokens, int) else None
