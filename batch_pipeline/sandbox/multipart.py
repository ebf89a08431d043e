"""A small parser for ``multipart/form-data`` bodies (field values and file parts)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from batch_pipeline.sandbox.errors import ApiError

_BOUNDARY_RE = re.compile(r'boundary=(?:"([^"]+)"|([^;\s]+))', re.IGNORECASE)
_PARAM_RE = re.compile(r';\s*(\w+)\*?=(?:"((?:[^"\\]|\\.)*)"|([^;\s]*))')


@dataclass(frozen=True)
class Part:
    """One form part: its field name, optional filename and content."""

    name: str
    filename: str | None
    content_type: str | None
    data: bytes


def parse_multipart(content_type: str, body: bytes) -> dict[str, Part]:
    """The parts of a multipart body, by field name (400 on a malformed body)."""
    if not content_type.lower().startswith("multipart/form-data"):
        raise ApiError(400, "Expected a multipart/form-data body.")
    found = _BOUNDARY_RE.search(content_type)
    if not found:
        raise ApiError(400, "The multipart Content-Type has no boundary.")
    delimiter = b"--" + (found.group(1) or found.group(2)).encode("latin-1")
    chunks = body.split(delimiter)
    if len(chunks) < 3:
        raise ApiError(400, "The multipart body has no parts.")
    parts: dict[str, Part] = {}
    for chunk in chunks[1:]:
        if chunk.startswith(b"--"):
            break
        chunk = chunk[2:] if chunk.startswith(b"\r\n") else chunk
        head, sep, data = chunk.partition(b"\r\n\r\n")
        if not sep:
            raise ApiError(400, "A multipart part has no header block.")
        if data.endswith(b"\r\n"):
            data = data[:-2]
        part = _part(head.decode("utf-8", "replace"), data)
        parts[part.name] = part
    return parts


def _part(head: str, data: bytes) -> Part:
    disposition = ""
    content_type = None
    for line in head.split("\r\n"):
        key, _, value = line.partition(":")
        if key.strip().lower() == "content-disposition":
            disposition = value
        elif key.strip().lower() == "content-type":
            content_type = value.strip()
    params = {
        m.group(1).lower(): m.group(2) if m.group(2) is not None else m.group(3)
        for m in _PARAM_RE.finditer(disposition)
    }
    if "name" not in params:
        raise ApiError(400, "A multipart part has no name.")
    return Part(params["name"], params.get("filename"), content_type, data)
