"""Deterministic embeddings (``/v1/embeddings``, online and as batch lines) with faults to test the gate.

A vector is the normalised sum of one pseudo-random Gaussian vector per word of the input (seeded by the model,
the word and the dimension), so the same input always gets the same vector and inputs that share words point the
same way: cosine similarity means something in tests. ``dimensions`` (default 1536 for text-embedding-3-small,
3072 for -large) and ``encoding_format`` (``float`` by default, or ``base64``: little-endian float32) are
honoured. Input tokens are counted with ``cl100k_base``, text-embedding-3's tokenizer; nothing else is billed.

Markers in the input text: ``[[sandbox:poison]]`` (400 context_length_exceeded), and, the first time the sandbox
sees a request (by custom_id in a batch, by its input online), ``[[sandbox:bad_dimension]]`` (one value short),
``[[sandbox:nan_vector]]`` (a NaN inside, base64 only: JSON has no NaN, so a float answer carries ``NaN``
as Python writes it) and ``[[sandbox:zero_vector]]`` (all zeros); a retry gets the right vector.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from typing import Any

import numpy as np

from batch_pipeline.sandbox.tokens import bpe

EMBEDDINGS_URL = "/v1/embeddings"
DEFAULT_DIMENSIONS = {"text-embedding-3-small": 1536, "text-embedding-3-large": 3072, "text-embedding-ada-002": 1536}
FALLBACK_DIMENSIONS = 1536
MAX_DIMENSIONS = 3072
MARKER_RE = re.compile(r"\[\[sandbox:(\w+)\]\]")
WORD_RE = re.compile(r"\w+")
FAULT_MARKERS = ("bad_dimension", "nan_vector", "zero_vector")


class EmbeddingRequestError(ValueError):
    """A request the API refuses (400), with the offending parameter."""

    def __init__(self, message: str, param: str, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param, self.code = param, code


def input_texts(body: dict[str, Any]) -> list[str]:
    """``input``: a non-empty string, or a non-empty list of non-empty strings."""
    value = body.get("input")
    if isinstance(value, str) and value:
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) and v for v in value):
        return list(value)
    raise EmbeddingRequestError(
        "'input' must be a non-empty string or a list of non-empty strings.",
        "input",
        "missing_required_parameter" if value is None else "invalid_value",
    )


def check_body(body: dict[str, Any]) -> tuple[str, list[str], int, str]:
    """(model, inputs, dimensions, encoding_format) of a valid embeddings body."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise EmbeddingRequestError("Missing required parameter: 'model'.", "model", "missing_required_parameter")
    texts = input_texts(body)
    native = DEFAULT_DIMENSIONS.get(model, FALLBACK_DIMENSIONS)
    dims = body.get("dimensions", native)
    if not isinstance(dims, int) or isinstance(dims, bool) or not 1 <= dims <= min(native, MAX_DIMENSIONS):
        raise EmbeddingRequestError(
            f"'dimensions' must be an integer between 1 and {native} for {model}.", "dimensions"
        )
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise EmbeddingRequestError("'encoding_format' must be 'float' or 'base64'.", "encoding_format")
    return model, texts, dims, encoding


def input_markers(body: dict[str, Any]) -> set[str]:
    try:
        texts = input_texts(body)
    except EmbeddingRequestError:
        return set()
    return {m for text in texts for m in MARKER_RE.findall(text)}


def _word_vector(model: str, word: str, dims: int) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(f"{model}|{dims}|{word}".encode()).digest()[:8], "little")
    return np.random.default_rng(seed).standard_normal(dims)


def embed_text(model: str, text: str, dims: int) -> np.ndarray:
    """The unit float32 vector of ``text`` (markers left out; an input without words still gets one)."""
    words = WORD_RE.findall(MARKER_RE.sub(" ", text).lower()) or [""]
    total = np.zeros(dims)
    for word in words:
        total += _word_vector(model, word, dims)
    norm = float(np.linalg.norm(total))
    return (total / norm if norm > 0 else total).astype(np.float32)


def faulty(vector: np.ndarray, marks: set[str]) -> np.ndarray:
    """The vector a fault marker asks for (the first time a request is seen)."""
    if "bad_dimension" in marks:
        return vector[:-1]
    if "nan_vector" in marks:
        out = vector.copy()
        out[0] = np.nan
        return out
    if "zero_vector" in marks:
        return np.zeros_like(vector)
    return vector


def encode(vector: np.ndarray, encoding: str) -> Any:
    if encoding == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return [float(v) for v in vector]


def input_tokens(texts: list[str]) -> int:
    enc = bpe("cl100k_base")
    return sum(len(enc.encode_ordinary(t)) for t in texts)


def embedding_response(body: dict[str, Any], *, first_sighting: bool) -> tuple[dict[str, Any], int]:
    """(the ``CreateEmbeddingResponse`` body, its prompt tokens) for a valid request; fault markers apply on the
    first sighting only."""
    model, texts, dims, encoding = check_body(body)
    marks = input_markers(body) if first_sighting else set()
    data = []
    for i, text in enumerate(texts):
        vector = faulty(embed_text(model, text, dims), marks)
        data.append({"object": "embedding", "index": i, "embedding": encode(vector, encoding)})
    tokens = input_tokens(texts)
    return (
        {"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}},
        tokens,
    )


def request_key(body: dict[str, Any]) -> str | None:
    """A stable hash of an embeddings request's input (one logical request across retries)."""
    canonical = json.dumps(
        [body.get("model"), body.get("input"), body.get("dimensions")], ensure_ascii=False, separators=(",", ":")
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:32]
