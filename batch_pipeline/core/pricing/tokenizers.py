"""Input tokens as each model family's provider counts them, offline: the quote's tokenizers.

A registry keyed by model family. OpenAI's current models use ``o200k_base`` (exact: the BPE ranks ship in
``batch_pipeline/bpe_ranks/`` and are checked against tiktoken's published SHA-256; tiktoken encodes; nothing is
downloaded at run time), older ones ``cl100k_base``. Open models (Llama, Qwen, Mistral, ...) are counted
with their own ``tokenizer.json`` (the ``tokenizers`` library) when the backend names a local model directory
or file (``backend.settings.tokenizer`` or ``model``, as vLLM's do), else with ``cl100k_base``, whose first 100k
tokens Llama 3's vocabulary shares. Claude's and Gemini's tokenizers are not published: they are counted by the
providers' documented density (Anthropic: "approximately 3.5 English characters" per token; Google: "about 4
characters" per token for Gemini), and the quote calibrates that on the canary's measured usage. A model
name the table does not know keeps the old UTF-8 bytes / 4.
"""

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

import tiktoken

from batch_pipeline import bpe
from batch_pipeline.core.errors import ConfigError
from batch_pipeline.core.pricing.cost import BYTES_PER_TOKEN

CLAUDE_CHARS_PER_TOKEN = 3.5  # Anthropic's documented average for English
GEMINI_CHARS_PER_TOKEN = 4.0  # Google's documented average for Gemini


class TokenCounter(Protocol):
    name: str
    exact: bool  # a real tokenizer of the model (else an average density, calibrated on the canary)

    def count(self, texts: Sequence[str]) -> list[int]: ...


def bpe_encoding(name: str) -> tiktoken.Encoding:
    """A tiktoken encoding from the rank file shipped in ``bpe_ranks/`` (``batch_pipeline.bpe``)."""
    try:
        return bpe.encoding(name)
    except bpe.BundledRanksError as exc:
        raise ConfigError(str(exc)) from None


@dataclass(frozen=True)
class BpeCounter:
    name: str
    exact: bool = True

    def count(self, texts: Sequence[str]) -> list[int]:
        encode = bpe_encoding(self.name).encode_ordinary
        return [len(encode(t)) for t in texts]


@dataclass(frozen=True)
class DensityCounter:
    """An average density: characters (or UTF-8 bytes) per token."""

    name: str
    per_token: float
    unit: str = "chars"
    exact: bool = False

    def count(self, texts: Sequence[str]) -> list[int]:
        size = (lambda t: len(t.encode())) if self.unit == "bytes" else len
        return [math.ceil(size(t) / self.per_token) for t in texts]


@dataclass(frozen=True)
class TokenizerFileCounter:
    """A Hugging Face ``tokenizer.json`` (open models), through the ``tokenizers`` library."""

    path: str
    name: str = field(init=False)
    exact: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", f"tokenizer.json ({Path(self.path).parent.name or self.path})")

    def count(self, texts: Sequence[str]) -> list[int]:
        from tokenizers import (
            Tokenizer,  # imported only when an open model has a local tokenizer file
        )

        tok = _tokenizer_file(self.path, Tokenizer)
        return [len(e.ids) for e in tok.encode_batch(list(texts), add_special_tokens=False)]


@lru_cache(maxsize=8)
def _tokenizer_file(path: str, cls: Any) -> Any:
    return cls.from_file(path)


def _local_tokenizer(settings: dict[str, Any]) -> str | None:
    """The ``tokenizer.json`` a backend's settings point at (a file, or a model directory holding one)."""
    for key in ("tokenizer", "model"):
        value = settings.get(key)
        if isinstance(value, str) and value:
            path = Path(value)
            path = path / "tokenizer.json" if path.is_dir() else path
            if path.name == "tokenizer.json" and path.is_file():
                return str(path)
    return None


def _open_model(settings: dict[str, Any]) -> TokenCounter:
    path = _local_tokenizer(settings)
    return TokenizerFileCounter(path) if path is not None else BpeCounter("cl100k_base", exact=False)


FAMILIES: tuple[tuple[re.Pattern[str], str], ...] = (  # model name -> family; the first match wins
    (re.compile(r"(^|[./])claude"), "claude"),  # claude-haiku-4-5, anthropic.claude-..., us.anthropic.claude-...
    (re.compile(r"(^|/)gemini"), "gemini"),  # gemini-2.5-flash, models/gemini-..., publishers/google/models/gemini-...
    (re.compile(r"^(gpt-4o|gpt-4\.1|gpt-4\.5|gpt-5|gpt-oss|chatgpt-4o|o\d)"), "o200k"),
    (re.compile(r"^(gpt-4|gpt-3\.5|text-embedding-)"), "cl100k"),  # text-embedding-3-*: cl100k_base
    (re.compile(r"llama|qwen|mistral|mixtral|phi-|gemma", re.IGNORECASE), "open"),
)
DEFAULT_FAMILY = "bytes"
COUNTERS: dict[str, Callable[[dict[str, Any]], TokenCounter]] = {
    "o200k": lambda settings: BpeCounter("o200k_base"),
    "cl100k": lambda settings: BpeCounter("cl100k_base"),
    "open": _open_model,
    "claude": lambda settings: DensityCounter("claude ~3.5 chars/token", CLAUDE_CHARS_PER_TOKEN),
    "gemini": lambda settings: DensityCounter("gemini ~4 chars/token", GEMINI_CHARS_PER_TOKEN),
    "bytes": lambda settings: DensityCounter("bytes/4", BYTES_PER_TOKEN, unit="bytes"),
}


def family(model: str) -> str:
    return next((fam for pattern, fam in FAMILIES if pattern.search(model)), DEFAULT_FAMILY)


def counter_for(model: str, backend_settings: dict[str, Any] | None = None) -> TokenCounter:
    """The token counter for ``model`` (``backend_settings``: where an open model's tokenizer file is)."""
    return COUNTERS[family(model)](backend_settings or {})
