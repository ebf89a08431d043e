"""A Gemini input file is read a line at a time (``scan_input``): the requests up to the first line that is not
one, that line named as ``bytes.splitlines`` numbers it, and the digest of the whole file (its processing order)."""

from __future__ import annotations

import hashlib
import io
import json

import pytest

from batch_pipeline.sandbox.google.gemini_inputs import InputScan, scan_input


def _line(key: str, text: str = "hi") -> bytes:
    return json.dumps({"key": key, "request": {"contents": [{"parts": [{"text": text}]}]}}).encode()


def _scan(data: bytes) -> tuple[list[str], str | None, str]:
    scan = InputScan()
    keys = [item["key"] for item in scan_input(io.BytesIO(data), scan)]
    return keys, scan.invalid, scan.digest.hexdigest()


def test_every_line_a_request() -> None:
    data = _line("a") + b"\n\n" + _line("b") + b"\r\n" + _line("c")
    keys, invalid, digest = _scan(data)
    assert keys == ["a", "b", "c"] and invalid is None and digest == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize(
    ("data", "keys", "message"),
    [
        (_line("a") + b"\n\nnot json\n" + _line("b"), ["a"], "Invalid JSON in the input file at line 3:"),
        (_line("a") + b"\r" + _line("a") + b"\n", ["a"], "Line 2: duplicate key 'a'."),
        (b'{"key": "a"}\n', [], "Line 1 of the input file has no `request` object."),
        (b'{"request": {}}\n', [], "Line 1 of the input file has no `key`."),
        (b'{"key": "a", "request": {"contents": []}}\n', [], "Line 1: `request.contents` must not be empty."),
        (b"\n \n", [], "The input file holds no requests."),
    ],
)
def test_the_first_line_that_is_no_request_is_named(data: bytes, keys: list[str], message: str) -> None:
    found, invalid, digest = _scan(data)
    assert found == keys and invalid is not None and invalid.startswith(message)
    assert digest == hashlib.sha256(data).hexdigest()  # the whole file, past the bad line
