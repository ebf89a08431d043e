"""The online executor's embeddings requests: ``POST {base_url}/embeddings``, one input per request.

The body builder has the chat one's interface (``path``, ``sdk_create``, ``data``, ``kwargs``,
``estimate_tokens``); a 200 becomes a ``RAW_RESULT_SCHEMA`` row with the decoded vector after it (the
``embedding`` column, see ``rows_table``).
"""

import json
from collections.abc import Sequence
from typing import Any

import openai
import pyarrow as pa

from batch_pipeline.core.ledger.executor import RAW_RESULT_SCHEMA, RequestPlan, raw_table
from batch_pipeline.executors.online.replies import unparseable_row
from batch_pipeline.executors.online.transport import SplicedBody
from batch_pipeline.executors.openai.embeddings import (
    EMBEDDING_FIELD,
    embedding_body,
    embedding_from_response,
    vectors_array,
)

EMBEDDINGS_PATH = "/embeddings"
_WIDTH = len(RAW_RESULT_SCHEMA)


class EmbeddingBodyBuilder(SplicedBody):
    """The body of an embeddings request: the shared settings serialised once, the input spliced in."""

    path = EMBEDDINGS_PATH

    @staticmethod
    def sdk_create(client: openai.OpenAI) -> Any:
        return client.embeddings.with_raw_response.create

    def __init__(self, plan: RequestPlan, extra_body: dict[str, Any] | None) -> None:
        super().__init__(plan, extra_body, embedding_body(plan))
        self._head = f'{{{self.inner},"input":'

    def data(self, prompt: str) -> bytes:
        return (self._head + json.dumps(prompt, ensure_ascii=False) + "}").encode("utf-8")

    def kwargs(self, prompt: str) -> dict[str, Any]:
        """Keyword arguments of ``embeddings.create``."""
        return {**embedding_body(self.plan), "input": prompt, "extra_body": self.extra_body or None}

    def estimate_tokens(self, prompt: str) -> float:
        """Tokens against the TPM limit: the input's bytes / 4 (embeddings generate nothing)."""
        return (len(prompt.encode("utf-8")) + 16) / 4


def embedding_success_row(request_id: str, payload: str, provider_request_id: str | None) -> tuple[Any, ...]:
    """A ``RAW_RESULT_SCHEMA`` row from a 200 embeddings body, with the vector (or None) after it."""
    try:
        body = json.loads(payload)
        vector, tokens = embedding_from_response(body if isinstance(body, dict) else {})
    except ValueError as exc:
        return (
            *unparseable_row(request_id, f"the 200 response is not JSON: {exc}", provider_request_id, payload),
            None,
        )
    code = None if vector is not None else "unparseable_response"
    message = None if vector is not None else "the 200 response carries no embedding"
    return (request_id, 200, None, None, tokens, 0, 0, code, message, provider_request_id, payload, vector)


def rows_table(rows: Sequence[tuple[Any, ...]]) -> pa.Table:
    """Rows as one table: ``raw_table``, plus the ``embedding`` column when any row carries a vector slot."""
    table = raw_table([r[:_WIDTH] for r in rows])
    if not any(len(r) > _WIDTH for r in rows):
        return table
    return table.append_column(EMBEDDING_FIELD, vectors_array([r[_WIDTH] if len(r) > _WIDTH else None for r in rows]))
