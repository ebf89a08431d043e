"""Answers of a Gemini embeddings batch (``models/M:asyncBatchEmbedContent``): one ``EmbedContentRequest`` in,
a ``SingleEmbedContentResponse`` (``{"embedding": {"values"}, "tokenCount"}``) or a ``google.rpc.Status`` out.

The vectors are the OpenAI emulator's (``sandbox/openai/embeddings.py``: unit-normalised, seeded by the model, the
words and the dimensions), so both providers' embeddings behave alike in tests, with the same markers
(``[[sandbox:poison]]`` fails the request; ``bad_dimension``, ``nan_vector``, ``zero_vector`` spoil the first
answer to a key) and the same ``line_errors`` scenario. ``outputDimensionality`` is honoured (3072, the model's
native size, without it). The text is billed as input at the Gemini family's token count; there is no output.
"""

from __future__ import annotations

from typing import Any

from batch_pipeline.sandbox.google.responder import GeminiAnswer, screen
from batch_pipeline.sandbox.openai.embeddings import (
    embed_text,
    encode,
    faulty,
)
from batch_pipeline.sandbox.scenarios import Scenario
from batch_pipeline.sandbox.tokens import input_tokens

# the operation's ``@type`` URLs for an embeddings batch (those of a generate batch: gemini_record.py)
EMBED_METADATA_TYPE = "type.googleapis.com/google.ai.generativelanguage.v1main.EmbedContentBatch"
EMBED_OUTPUT_TYPE = "type.googleapis.com/google.ai.generativelanguage.v1main.EmbedContentBatchOutput"
NATIVE_DIMENSIONS = 3072  # gemini-embedding-001's full size, and the most it gives


def _field(request: dict[str, Any], camel: str, snake: str) -> Any:
    """A field by its lowerCamel or its proto name (proto JSON takes both; the SDK's inline source sends camel)."""
    return request.get(camel, request.get(snake))


def embed_text_of(request: dict[str, Any]) -> str:
    """The text parts of ``request.content``, joined."""
    content = request.get("content")
    parts = content.get("parts") if isinstance(content, dict) else None
    return "\n".join(p["text"] for p in parts or [] if isinstance(p, dict) and isinstance(p.get("text"), str))


def dimensions_of(request: dict[str, Any]) -> Any:
    return _field(request, "outputDimensionality", "output_dimensionality") or NATIVE_DIMENSIONS


def embed_problem(request: dict[str, Any]) -> str | None:
    """Why an ``EmbedContentRequest`` fails the batch (no text to embed, a dimension out of range)."""
    if not embed_text_of(request):
        return "`request.content.parts[].text` must not be empty."
    dims = dimensions_of(request)
    if not isinstance(dims, int) or isinstance(dims, bool) or not 1 <= dims <= NATIVE_DIMENSIONS:
        return f"`request.outputDimensionality` must be an integer from 1 to {NATIVE_DIMENSIONS}; got {dims!r}."
    return None


def embed_tokens(model: str, request: dict[str, Any]) -> int:
    """The input tokens an embeddings request is billed for (its text, the Gemini family's count)."""
    return input_tokens(embed_text_of(request), model)


class GeminiEmbedder:
    """Answers embeddings requests; shares the responder's memory of how often each key was seen."""

    def __init__(self, seen_keys: dict[str, int]) -> None:
        self.seen_keys = seen_keys

    def answer(
        self, key: str, model: str, request: dict[str, Any], scenario: Scenario, tokens: int | None = None
    ) -> GeminiAnswer:
        text = embed_text_of(request)
        sightings, marks, failed = screen(self.seen_keys, key, model, text, scenario)
        if failed is not None:
            return failed
        name = model.removeprefix("models/")
        vector = embed_text(name, text, int(dimensions_of(request)))
        vector = faulty(vector, marks) if sightings == 0 else vector
        tokens = embed_tokens(model, request) if tokens is None else tokens
        # int64 tokenCount as a JSON string, as proto3 JSON writes it
        response = {"embedding": {"values": encode(vector, "float")}, "tokenCount": str(tokens)}
        return GeminiAnswer(key, model, response=response, prompt_tokens=tokens)
