"""Gemini batch embeddings (``models/M:asyncBatchEmbedContent``), both ways: input lines out, vectors in.

An input line is ``{"key": request_id, "request": EmbedContentRequest}`` with the rendered template as the one
text part and ``outputDimensionality`` from ``output.embedding.dimensions``. A result line is ``{"key",
"response": {"embedding": {"values": [...]}, "tokenCount"}}`` (a ``SingleEmbedContentResponse``) or ``{"key",
"error": google.rpc.Status}``; rows come back as the OpenAI embeddings parser's ``EMBEDDING_RAW_SCHEMA`` (the
same vector column the gate and the table read), errors through the same Status mapping as generated lines.

The SDK's ``BatchJob`` does not say which kind of batch it is, so ``parse_any_block`` tells a block of
embeddings from a block of ``GenerateContentResponse`` lines by its first response; a block of errors only is
the same rows either way (the vector column is optional and reads as null).
"""

import json
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa

from batch_pipeline.core.ledger.executor import ShardWork
from batch_pipeline.executors.google.format import _int, error_columns, parse_block
from batch_pipeline.executors.jsonl_blocks import RESULT_BLOCK_BYTES, parse_stream
from batch_pipeline.executors.openai.embeddings import (
    decode_vector,
    embedding_body,
    embedding_table,
)


def embed_input_file(work: ShardWork) -> bytes:
    """The attempt's JSONL of ``EmbedContentRequest`` lines (``embedding_body`` refuses chat turns)."""
    dims = int(embedding_body(work.plan)["dimensions"])
    dumps = json.dumps
    ids = work.items.column("request_id").to_pylist()
    prompts = work.items.column("user_prompt").to_pylist()
    return "".join(
        f'{{"key":{dumps(rid)},"request":{{"content":{{"parts":[{{"text":{dumps(prompt, ensure_ascii=False)}}}]}},'
        f'"outputDimensionality":{dims}}}}}\n'
        for rid, prompt in zip(ids, prompts)
    ).encode("utf-8")


def _row(raw: bytes) -> tuple[Any, ...]:
    """(request_id, http_status, vector, input_tokens, error_code, error_message, line) of one result line."""
    text = raw.decode("utf-8", "replace")
    try:
        obj = json.loads(raw)
    except ValueError as exc:
        return None, None, None, None, "unparseable_line", str(exc)[:300], text
    if not isinstance(obj, dict):
        return None, None, None, None, "unparseable_line", "the line is not a JSON object", text
    key = obj.get("key") if isinstance(obj.get("key"), str) else None
    if isinstance(obj.get("error"), dict):
        status, *_, code, message = error_columns(obj["error"])
        return key, status, None, None, code, message, text
    response = obj.get("response")
    if not isinstance(response, dict):
        return key, None, None, None, "missing_result", "the result line has neither a response nor an error", text
    embedding = response.get("embedding") if isinstance(response.get("embedding"), dict) else {}
    vector = decode_vector(embedding.get("values"))
    if vector is None:
        return (
            key,
            200,
            None,
            _int(response.get("tokenCount")),
            "unparseable_response",
            "the response carries no embedding",
            text,
        )
    return key, 200, vector, _int(response.get("tokenCount")), None, None, text


def parse_embed_block(block: bytes) -> pa.Table:
    """Result lines of an embeddings batch -> ``EMBEDDING_RAW_SCHEMA`` rows (no output text, no output tokens)."""
    rows = [_row(line) for line in block.split(b"\n") if line.strip()]
    ids, status, vectors, tokens, codes, messages, lines = (list(c) for c in zip(*rows)) if rows else ([],) * 7
    zero = [0 if v is not None else None for v in vectors]
    return embedding_table(ids, status, tokens, zero, codes, messages, None, lines, vectors)


def is_embed_block(block: bytes) -> bool:
    """The block's first line with a response answers an embeddings request (``response.embedding``)."""
    for line in block.split(b"\n"):
        if b'"response"' not in line:
            continue
        try:
            response = json.loads(line).get("response")
        except (ValueError, AttributeError):
            continue
        if isinstance(response, dict):
            return "embedding" in response
    return False


def parse_any_block(block: bytes) -> pa.Table:
    return parse_embed_block(block) if is_embed_block(block) else parse_block(block)


def parse_any_stream(
    chunks: Iterable[bytes], workers: int = 1, block_bytes: int = RESULT_BLOCK_BYTES
) -> Iterator[pa.Table]:
    """A downloaded responses file of either kind of batch -> one table per block, in file order."""
    return parse_stream(parse_any_block, chunks, workers, block_bytes)
