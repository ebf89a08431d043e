"""An embeddings job on vLLM: a pooling model, ``LLM.embed`` over token IDs, a block of items at a time.

The engine is the process's one (``load_engine``) built with ``runner="pooling"``: a decoder such as Llama is
converted to an embedding model (vLLM's default pooler for it: the last token, normalised). Each item's text is
tokenised as it is (no chat template: an embedding embeds the text, not a conversation); a text longer than
``max_model_len`` is a poison row. The vector length is the model's hidden size, which must be
``output.embedding.dimensions`` (checked before anything runs; the gate checks every vector again). Rows are
``RAW_RESULT_SCHEMA`` plus the ``embedding`` column, ``flush_every`` items per table.
"""

import base64
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from batch_pipeline.core.errors import ConfigError
from batch_pipeline.core.ledger.executor import ShardWork
from batch_pipeline.executors.online.embeddings import rows_table
from batch_pipeline.executors.openai.embeddings import embedding_body
from batch_pipeline.executors.vllm.engine import VllmSettings


def pooling_settings(settings: VllmSettings) -> VllmSettings:
    """The engine settings of an embeddings job: the same, with the pooling runner."""
    return settings.model_copy(update={"runner": "pooling"})


def check_dimensions(llm: Any, dimensions: int) -> None:
    hidden = getattr(llm.llm_engine.model_config.hf_config, "hidden_size", None)
    if hidden is not None and hidden != dimensions:
        raise ConfigError(
            f"backend vllm: the model's embeddings have {hidden} dimensions (its hidden size); "
            f"output.embedding.dimensions is {dimensions}"
        )


def embed_rows(llm: Any, work: ShardWork, flush_every: int) -> Iterator[pa.Table]:
    """Embed the shard's items; one table per ``flush_every`` items, in item order."""
    embedding_body(work.plan)  # an embeddings plan of text items (raises otherwise)
    assert work.plan.output.embedding is not None
    check_dimensions(llm, work.plan.output.embedding.dimensions)
    ids = work.items.column("request_id").to_pylist()
    texts = work.items.column("user_prompt").to_pylist()
    tokenizer = llm.get_tokenizer()
    max_len = llm.llm_engine.model_config.max_model_len
    for start in range(0, len(ids), flush_every):
        rows: list[tuple] = []
        chunk = list(range(start, min(start + flush_every, len(ids))))
        encoded = [tokenizer.encode(texts[i], add_special_tokens=True) for i in chunk]
        runnable = [(i, tokens) for i, tokens in zip(chunk, encoded) if len(tokens) < max_len]
        for i, tokens in zip(chunk, encoded):
            if len(tokens) >= max_len:
                message = f"input is {len(tokens)} tokens; max_model_len is {max_len}"
                payload = json.dumps(
                    {"id": f"{work.key}#{i}", "error": {"code": "context_length_exceeded", "message": message}}
                )
                rows.append(
                    (
                        ids[i],
                        400,
                        None,
                        None,
                        None,
                        None,
                        None,
                        "context_length_exceeded",
                        message,
                        f"{work.key}#{i}",
                        payload,
                    )
                )
        if runnable:
            outputs = llm.embed([{"prompt_token_ids": tokens} for _, tokens in runnable], use_tqdm=False)
            for (i, tokens), out in zip(runnable, outputs, strict=True):
                vector = np.asarray(out.outputs.embedding, dtype=np.float32)
                payload = json.dumps(
                    {
                        "id": out.request_id,
                        "prompt_tokens": len(tokens),
                        "embedding": base64.b64encode(vector.astype("<f4").tobytes()).decode(),
                    }
                )
                rows.append(
                    (ids[i], 200, None, None, len(tokens), 0, 0, None, None, f"{work.key}#{i}", payload, vector)
                )
        yield rows_table(rows)
