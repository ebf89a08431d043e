"""``decode_line`` is ``json.loads`` of a request line: the same value, or the same kind of error, on every input."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from batch_pipeline.sandbox.spooled_parts import decode_line

LINE = {"custom_id": "r-1", "method": "POST", "body": {"model": "m", "messages": [{"content": "caf\u00e9 \u2603"}]}}
TEXT = json.dumps(LINE)
ODD = [
    TEXT.encode(),
    json.dumps(LINE, ensure_ascii=False).encode(),
    b"  \t" + TEXT.encode(),  # leading whitespace
    TEXT.encode() + b" \r",  # a CRLF file's line
    TEXT.encode() + b" x",  # extra data
    TEXT.encode() + b"\xa0",  # trailing whitespace that is not JSON's
    b"\xef\xbb\xbf" + TEXT.encode(),  # a UTF-8 byte-order mark
    TEXT.encode("utf-16"),
    TEXT.encode("utf-16-le"),
    TEXT.encode("utf-32"),
    b'{"a": "\\ud800"}',  # a lone surrogate, which JSON allows
    b'{"a": "\xff"}',  # not UTF-8
    b"",
    b"   ",
    b"[1, 2]",
    b'"just a string"',
    b"12",
    b"nul",
    b'{"a": NaN, "b": -Infinity}',
    b'{"a": 1, "a": 2}',  # a repeated key: the last one
    b'{"a": 1,}',
    b"{" * 50 + b"}" * 50,
]


def _outcome(decode: Any, raw: bytes) -> tuple[str, Any]:
    try:
        return "value", decode(raw)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError alike
        return "error", type(exc)


@pytest.mark.parametrize("raw", ODD, ids=range(len(ODD)))
def test_a_line_decodes_as_json_loads_decodes_it(raw: bytes) -> None:
    assert repr(_outcome(decode_line, raw)) == repr(_outcome(json.loads, raw))


def test_random_lines_and_their_cuts_decode_as_json_loads_decodes_them() -> None:
    rng = random.Random(3)
    alphabet = ['"', "\\", "u", "0", "d", "8", "{", "}", "[", "]", ",", ":", " ", "\n", "a", "\u00e9", "1", "-", "e"]
    for _ in range(3000):
        value = {"k": "".join(rng.choices(alphabet, k=rng.randrange(12))), "n": rng.random(), "l": [1, None, True]}
        raw = json.dumps(value, ensure_ascii=rng.random() < 0.5).encode()
        for cut in (raw, raw[: rng.randrange(len(raw) + 1)], raw + rng.choice([b" ", b"\t\r", b"}", b"\x00"])):
            assert repr(_outcome(decode_line, cut)) == repr(_outcome(json.loads, cut))
