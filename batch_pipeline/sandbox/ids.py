"""Identifiers: random ones for new objects, stable ones derived from content."""

from __future__ import annotations

import hashlib
import secrets


def new_id(prefix: str) -> str:
    """A fresh id such as ``batch_<24 hex>`` or ``file-<24 hex>``."""
    return prefix + secrets.token_hex(12)


def stable_hex(*parts: str, length: int = 24) -> str:
    """Hex digest of the parts, for ids and choices that must not vary between runs."""
    digest = hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()
    return digest[:length]


def stable_fraction(*parts: str) -> float:
    """A number in [0, 1) derived from the parts."""
    return int(stable_hex(*parts, length=16), 16) / float(1 << 64)
