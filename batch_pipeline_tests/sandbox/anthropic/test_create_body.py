"""A create body's requests are checked and spooled one at a time (``create_body.py``): the spooled lines are the
requests as given, and a body that is not a create's fails with the error it failed with when decoded whole."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from batch_pipeline.sandbox.anthropic import create_body
from batch_pipeline.sandbox.anthropic.errors import AnthropicError


def _request(custom_id: str, model: str = "claude-haiku-4-5") -> dict[str, Any]:
    params = {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": f"hi {custom_id} é"}]}
    return {"custom_id": custom_id, "params": params}


def _error(body: bytes, target: Path) -> str:
    with pytest.raises(AnthropicError) as caught:
        create_body.parse_create(body, target)
    assert not target.exists()  # nothing left behind
    return str(caught.value.body()["error"]["message"])


def test_the_requests_are_spooled_as_they_are_checked(tmp_path: Path) -> None:
    requests = [_request(f"r{i}", model="claude-sonnet-4-5" if i % 3 else "claude-haiku-4-5") for i in range(50)]
    body = json.dumps({"requests": requests, "after": {"nested": [1, 2, {"x": "]"}]}}, indent=2).encode()
    parsed = create_body.parse_create(body, tmp_path / "b.requests")
    assert list(parsed.lines) == requests and parsed.custom_ids == [r["custom_id"] for r in requests]
    assert parsed.models == {"claude-haiku-4-5": 17, "claude-sonnet-4-5": 33}
    assert parsed.lines.path.read_bytes().count(b"\n") == 50


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"requests": [', "The request body is not valid JSON"),
        (b'{"requests": []} trailing', "The request body is not valid JSON"),
        (b"[1, 2]", "The request body must be a JSON object."),
        (b'{"other": 1}', "requests: Field required"),
        (b'{"requests": {"a": 1}}', "requests: Field required"),
        (b'{"requests": []}', "requests: a batch holds between 1 and 100000 requests, not 0"),
        (b"", "requests: Field required"),
        (b'{"requests": [{"custom_id": "a b"}]}', "requests.0.custom_id: String should match pattern"),
    ],
)
def test_a_body_that_is_not_a_create_fails_as_when_decoded_whole(tmp_path: Path, body: bytes, message: str) -> None:
    assert _error(body, tmp_path / "b.requests").startswith(message)


def test_duplicates_and_too_many_requests_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    twice = json.dumps({"requests": [_request("a"), _request("b"), _request("a")]}).encode()
    assert _error(twice, tmp_path / "b.requests").startswith("requests.2.custom_id: Duplicate custom_id 'a'")
    monkeypatch.setattr(create_body, "MAX_REQUESTS", 3)
    many = json.dumps({"requests": [_request(f"r{i}") for i in range(5)]}).encode()
    assert _error(many, tmp_path / "b.requests") == "requests: a batch holds between 1 and 3 requests, not 5"
