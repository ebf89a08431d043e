"""Deterministic token counting: what the sandbox bills as input, by model family, and a word-run count for the
answers it writes.

Input is billed as the providers' tokenizers would count it, offline: OpenAI-family models (and any model name
the table does not know, e.g. an Azure deployment) with ``o200k_base``; open models (Llama, Qwen, Mistral) with
``cl100k_base``, whose first 100k tokens Llama 3's vocabulary shares. Claude's and Gemini's tokenizers cannot
be had offline, so the sandbox stands in for them with ``o200k_base`` pieces scaled to each provider's published
density (Anthropic: about 3.5 English characters per token, Gemini: about 4, against o200k's ~4.4 on English
prose): x1.25 and x1.1. The pipeline's quote does not read these factors; it estimates from characters and
calibrates on the canary. The BPE ranks ship with the package (``batch_pipeline/bpe_ranks/``), checked against tiktoken's published
SHA-256; nothing is downloaded.

Answers (output tokens, ``max_tokens`` truncation) keep one token per word run or punctuation mark.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import tiktoken

from batch_pipeline.bpe import counter, encoding

TOKEN_RE = re.compile(r"\w+|[^\w\s]")
PER_MESSAGE_TOKENS = 4  # role and separators, per message
REPLY_PRIMING_TOKENS = 3  # the assistant turn every chat request opens (OpenAI's counting)


def bpe(name: str) -> tiktoken.Encoding:
    """The same encoding the pipeline quotes with (``batch_pipeline.bpe``, hash-checked, never downloaded)."""
    return encoding(name)


def _scaled(n: int, scale: float) -> int:
    return n if scale == 1.0 else math.ceil(n * scale)


def _bpe_count(name: str, scale: float = 1.0) -> Callable[[str], int]:
    # a batch's lines share their system prompt and output schema: each is counted once, not at every create and
    # run of every line (a few recent texts kept: the shared ones stay, each line's own user text passes through)
    @lru_cache(maxsize=64)
    def count(text: str) -> int:
        return _scaled(counter(name)(text), scale)  # exact, each word's count kept (``bpe.ChunkCounter``)

    return count


FAMILIES: tuple[tuple[re.Pattern[str], str], ...] = (  # model name -> family; first match wins
    (re.compile(r"(^|[./])claude"), "claude"),
    (re.compile(r"(^|/)gemini"), "gemini"),
    (re.compile(r"llama|qwen|mistral", re.IGNORECASE), "open"),
)
DEFAULT_FAMILY = "openai"
ENCODINGS: dict[str, tuple[str, float]] = {  # family -> (BPE encoding, scale)
    "openai": ("o200k_base", 1.0),
    "open": ("cl100k_base", 1.0),
    "claude": ("o200k_base", 1.25),
    "gemini": ("o200k_base", 1.1),
}
INPUT_COUNTERS: dict[str, Callable[[str], int]] = {fam: _bpe_count(*spec) for fam, spec in ENCODINGS.items()}


@lru_cache(maxsize=256)
def family(model: str | None) -> str:
    """The tokenizer family the sandbox bills ``model`` with (cached: a batch names one model on every line, and
    the three regex searches ran at every message counted)."""
    name = model or ""
    return next((fam for pattern, fam in FAMILIES if pattern.search(name)), DEFAULT_FAMILY)


def input_tokens(text: str, model: str | None = None) -> int:
    """Billed input tokens of ``text`` for ``model``'s family."""
    return INPUT_COUNTERS[family(model)](text) if text else 0


def input_tokens_many(texts: list[str], model: str | None = None) -> list[int]:
    """``[input_tokens(t, model) for t in texts]``, each distinct text counted once and, for an o200k family, a
    slice of texts at a time (``bpe.ChunkCounter.count_many``): a batch's requests, counted at its create."""
    name, scale = ENCODINGS[family(model)]
    many = getattr(counter(name), "count_many", None)
    if many is None:
        return [input_tokens(t, model) for t in texts]
    distinct = dict.fromkeys(texts)
    for text, n in zip(distinct, many(list(distinct)), strict=True):
        distinct[text] = _scaled(n, scale)
    return [distinct[t] for t in texts]  # type: ignore[misc]  # every text counted above


def count_tokens(text: str) -> int:
    """Tokens of an answer by the regex ``\\w+|[^\\w\\s]`` (``findall``'s list: a generator over match objects
    was ~3x the cost)."""
    return len(TOKEN_RE.findall(text))


def truncate_tokens(text: str, limit: int) -> str:
    """The prefix of ``text`` holding its first ``limit`` tokens."""
    if limit <= 0:
        return ""
    end = 0
    for index, match in enumerate(TOKEN_RE.finditer(text)):
        if index >= limit:
            break
        end = match.end()
    return text[:end]


def content_text(content: Any) -> str:
    """The text of a chat message's content (a string or a list of parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif isinstance(part, str):
                texts.append(part)
        return "\n".join(texts)
    return ""


def message_tokens(message: Any, model: str | None = None) -> int:
    """Tokens of one chat message: its text plus a fixed per-message overhead."""
    content = message.get("content") if isinstance(message, dict) else None
    return input_tokens(content_text(content), model) + PER_MESSAGE_TOKENS


def schema_tokens(body: dict[str, Any]) -> int:
    """A structured-output schema is part of the prompt and billed as input: its JSON, counted as text."""
    fmt = body.get("response_format")
    schema = (fmt.get("json_schema") or {}).get("schema") if isinstance(fmt, dict) else None
    if not isinstance(schema, dict):
        return 0
    # every line of a batch carries the same schema: its count is kept by its ``repr`` (~2x cheaper than the
    # ``json.dumps`` that is counted). For parsed JSON the repr is exact: it keeps key order and tells 1, 1.0 and
    # True apart, so one repr is one JSON text
    key = (repr(schema), family(body.get("model")))
    count = _SCHEMA_COUNTS.get(key)
    if count is None:
        if len(_SCHEMA_COUNTS) >= SCHEMA_COUNTS_KEPT:
            _SCHEMA_COUNTS.clear()
        count = _SCHEMA_COUNTS[key] = input_tokens(json.dumps(schema), body.get("model"))
    return count


SCHEMA_COUNTS_KEPT = 64
_SCHEMA_COUNTS: dict[tuple[str, str], int] = {}


def request_input_tokens(body: dict[str, Any]) -> int:
    """Billed input of a chat-completions request: its messages, the reply priming and the output schema."""
    texts, fixed, model = request_input_parts(body)
    return fixed + sum(input_tokens(t, model) for t in texts)


def request_input_parts(body: dict[str, Any]) -> tuple[list[str], int, str]:
    """What ``request_input_tokens`` counts: its messages' texts (counted by ``model``'s family), and the tokens
    that are fixed (each message's overhead, the reply priming, the output schema)."""
    raw = body.get("messages")
    messages = [m for m in raw if isinstance(m, dict)] if isinstance(raw, list) else []
    texts = [content_text(m.get("content")) for m in messages]
    fixed = PER_MESSAGE_TOKENS * len(messages) + REPLY_PRIMING_TOKENS + schema_tokens(body)
    return texts, fixed, str(body.get("model") or "")
