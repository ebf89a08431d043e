"""The ``requests`` of a message batch create body, checked and written to the batch's spooled requests one at a
time.

Decoded whole, a 100,000-request body (45 MB) was ~280 MB of dicts for the length of the create: the sandbox's
peak on an Anthropic job. Here the body's text is walked member by member and the ``requests`` array decoded an
item at a time (``raw_decode``), each item checked and written as it comes. A body the walk cannot follow (not
JSON, not an object, ``requests`` not an array) is decoded whole, as before, for the error it deserves.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batch_pipeline.sandbox.anthropic.errors import anthropic_error, invalid_request
from batch_pipeline.sandbox.spooled_lines import SpooledLines

MAX_REQUESTS = 100_000
MAX_BYTES = 256 * 1024 * 1024
CUSTOM_ID_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"[ \t\n\r]*")


class _Unfollowed(ValueError):
    """The walk met something it does not follow: the body is decoded whole instead."""


@dataclass
class CreateBody:
    """A create's requests, spooled: their lines, custom_ids (in order) and how many ask for each model."""

    lines: SpooledLines
    custom_ids: list[str]
    models: dict[str, int]


def check_request(index: int, item: Any, seen: set[str]) -> dict[str, Any]:
    """One entry of ``requests``: custom_id pattern and uniqueness, params with model, max_tokens, messages."""
    where = f"requests.{index}"
    if not isinstance(item, dict):
        raise invalid_request(f"{where}: Input should be an object")
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not CUSTOM_ID_RE.match(custom_id):
        raise invalid_request(f"{where}.custom_id: String should match pattern '{CUSTOM_ID_RE.pattern}'")
    if custom_id in seen:
        raise invalid_request(
            f"{where}.custom_id: Duplicate custom_id {custom_id!r}; custom_ids must be unique within a batch"
        )
    seen.add(custom_id)
    params = item.get("params")
    if not isinstance(params, dict):
        raise invalid_request(f"{where}.params: Field required")
    if not isinstance(params.get("model"), str) or not params["model"]:
        raise invalid_request(f"{where}.params.model: Field required")
    max_tokens = params.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
        raise invalid_request(f"{where}.params.max_tokens: Field required")
    if max_tokens < 1:
        raise invalid_request(f"{where}.params.max_tokens: Input should be greater than or equal to 1")
    messages = params.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid_request(f"{where}.params.messages: Field required")
    return {"custom_id": custom_id, "params": params}


def parse_create(body: bytes, target: Path) -> CreateBody:
    """The validated ``requests`` of a create body (1-100,000 requests, at most 256 MB), written to ``target``."""
    if len(body) > MAX_BYTES:
        raise anthropic_error(413, f"Request exceeds the maximum allowed number of bytes ({MAX_BYTES}).")
    try:
        try:
            parsed = _spooled(_requests(body), target)
        except _Unfollowed:
            parsed = _spooled(iter(_decoded_whole(body)), target)
    except _TooMany as many:
        target.unlink(missing_ok=True)
        raise invalid_request(
            f"requests: a batch holds between 1 and {MAX_REQUESTS} requests, not {many.count}"
        ) from None
    except BaseException:
        target.unlink(missing_ok=True)
        raise
    return parsed


def _spooled(items: Iterator[Any], target: Path) -> CreateBody:
    """``items`` checked and written to ``target`` as they come."""
    custom_ids: list[str] = []
    models: dict[str, int] = {}
    seen: set[str] = set()

    def checked() -> Iterator[dict[str, Any]]:
        for index, item in enumerate(items):
            if index >= MAX_REQUESTS:
                raise _TooMany(index + 1 + sum(1 for _ in items))
            request = check_request(index, item, seen)
            custom_ids.append(request["custom_id"])
            model = request["params"]["model"]
            models[model] = models.get(model, 0) + 1
            yield request

    lines = SpooledLines.write(target, checked())
    if not custom_ids:
        raise _TooMany(0)
    return CreateBody(lines, custom_ids, models)


class _TooMany(Exception):
    def __init__(self, count: int) -> None:
        super().__init__(count)
        self.count = count


def _decoded_whole(body: bytes) -> list[Any]:
    """The ``requests`` of a body decoded whole, with the errors of a body that is not a create's."""
    try:
        payload = json.loads(body or b"{}")
    except ValueError as exc:
        raise invalid_request(f"The request body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise invalid_request("The request body must be a JSON object.")
    requests = payload.get("requests")
    if not isinstance(requests, list):
        raise invalid_request("requests: Field required")
    return requests


def _requests(body: bytes) -> Iterator[Any]:
    """The items of the body's top-level ``requests`` array one at a time, then the rest of the body walked to its
    end (so a body that is not JSON after the array still fails); ``_Unfollowed`` where the walk gives up."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise _Unfollowed from None
    position, found = _space(text, 0), False
    if not text.startswith("{", position):
        raise _Unfollowed
    position = _space(text, position + 1)
    while not text.startswith("}", position):
        key, position = _decode(text, position)
        position = _space(text, position)
        if not isinstance(key, str) or not text.startswith(":", position):
            raise _Unfollowed
        position = _space(text, position + 1)
        if key == "requests" and not found and text.startswith("[", position):
            found = True
            position = _space(text, position + 1)
            while not text.startswith("]", position):
                item, position = _decode(text, position)
                yield item
                position = _space(text, position)
                if text.startswith(",", position):
                    position = _space(text, position + 1)
                elif not text.startswith("]", position):
                    raise _Unfollowed
            position += 1
        else:
            if key == "requests":  # not an array, or given twice: json.loads says what it makes of it
                raise _Unfollowed
            _, position = _decode(text, position)
        position = _space(text, position)
        if text.startswith(",", position):
            position = _space(text, position + 1)
        elif not text.startswith("}", position):
            raise _Unfollowed
    if not found or _space(text, position + 1) != len(text):
        raise _Unfollowed


def _decode(text: str, position: int) -> tuple[Any, int]:
    try:
        return _DECODER.raw_decode(text, position)
    except ValueError:
        raise _Unfollowed from None


def _space(text: str, position: int) -> int:
    match = _SPACE.match(text, position)
    assert match is not None
    return match.end()
