"""``parse_multipart`` finds the parts by their delimiters' offsets and copies each part's data once. Against the
split-based parser it replaced (kept here as the oracle), on well-formed bodies, bodies with a preamble, parts with
and without their CRLFs, delimiters inside the data, and every malformed shape (the same 400 or the same parts)."""

from __future__ import annotations

import random

import pytest

from batch_pipeline.sandbox.errors import ApiError
from batch_pipeline.sandbox.multipart import Part, _part, parse_multipart

CONTENT_TYPE = 'multipart/form-data; boundary="b0und"'


def _split_oracle(body: bytes) -> dict[str, Part]:
    """The parser before (``body.split`` on the delimiter, then a strip and two slices per part)."""
    chunks = body.split(b"--b0und")
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


def _outcome(parse, body: bytes) -> object:
    try:
        return parse(body)
    except ApiError as exc:
        return (exc.status, exc.body())


PIECES = [b"--b0und", b"--b0und--", b"\r\n", b"\r\n\r\n", b"--", b"x", b"data\n", b'"', b"\xff",
          b'Content-Disposition: form-data; name="file"; filename="in.jsonl"',
          b'Content-Disposition: form-data; name="purpose"', b"Content-Type: application/jsonl"]  # fmt: skip


def test_the_parts_are_those_the_split_parser_found():
    rng = random.Random(11)
    for _ in range(5_000):
        body = b"".join(rng.choice(PIECES) for _ in range(rng.randint(0, 14)))
        assert _outcome(lambda b: parse_multipart(CONTENT_TYPE, b), body) == _outcome(_split_oracle, body), body


def test_an_upload_as_the_sdks_send_it():
    lines = b"".join(b'{"custom_id": "r%d"}\n' % i for i in range(1000))
    body = (
        b'--b0und\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--b0und\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
        b"Content-Type: application/octet-stream\r\n\r\n" + lines + b"\r\n--b0und--\r\n"
    )
    parts = parse_multipart(CONTENT_TYPE, body)
    assert parts["purpose"].data == b"batch"
    assert parts["file"] == Part("file", "in.jsonl", "application/octet-stream", lines)
    assert parts == _split_oracle(body)


@pytest.mark.parametrize("content_type", ["text/plain", "multipart/form-data"])
def test_a_body_that_is_not_multipart_or_has_no_boundary_is_a_400(content_type):
    with pytest.raises(ApiError) as caught:
        parse_multipart(content_type, b"--b0und\r\n\r\n--b0und--")
    assert caught.value.status == 400
