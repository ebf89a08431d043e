"""Deterministic token counting: one token per word run or punctuation mark."""

from __future__ import annotations

import re
from typing import Any

TOKEN_RE = re.compile(r"\w+|[^\w\s]")
PER_MESSAGE_TOKENS = 4


def count_tokens(text: str) -> int:
    """Tokens in ``text`` by the regex ``\\w+|[^\\w\\s]``."""
    return sum(1 for _ in TOKEN_RE.finditer(text))


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


def message_tokens(message: Any) -> int:
    """Tokens of one chat message: its text plus a fixed per-message overhead."""
    content = message.get("content") if isinstance(message, dict) else None
    return count_tokens(content_text(content)) + PER_MESSAGE_TOKENS


def prompt_tokens(messages: list[Any]) -> int:
    """Tokens of a whole prompt."""
    return sum(message_tokens(m) for m in messages)
