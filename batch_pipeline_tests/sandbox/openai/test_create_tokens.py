"""A create counts its requests' prompt tokens a slice at a time (``RequestKeeper``): each request is billed what
``billed_input_tokens`` counts of it alone, whatever the scenario, the model's family or the slice it fell in."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from batch_pipeline.sandbox.openai import create_tokens
from batch_pipeline.sandbox.openai.create_tokens import RequestKeeper
from batch_pipeline.sandbox.openai.processing import billed_input_tokens
from batch_pipeline.sandbox.openai.validation import CHAT_URL, EMBEDDINGS_URL, parse_input
from batch_pipeline.sandbox.scenarios import make_scenario

WORDS = "the order never arrived and support did not answer billing bug crash refund café über 42".split()
SCHEMA = {"type": "object", "properties": {"label": {"type": "string", "enum": ["billing", "bug", "other"]}}}


def _text(rng: random.Random) -> str:
    spaces = [" ", " ", " ", "  ", " \n", "\t "]
    return "".join(rng.choice(WORDS) + rng.choice(spaces) for _ in range(rng.randint(0, 60)))


def _chat_lines(n: int, model: str, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        messages: list[Any] = [{"role": "system", "content": "Label the ticket: billing, bug or other."}]
        messages.append({"role": "user", "content": _text(rng)})
        if i % 7 == 0:  # content as parts, and a message that is not an object
            messages.append({"role": "user", "content": [{"type": "text", "text": _text(rng)}, "tail text"]})
            messages.append("not a message")
        body: dict[str, Any] = {"model": model, "messages": messages}
        if i % 3 == 0:
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "l", "schema": SCHEMA}}
        lines.append({"custom_id": f"r{i}", "method": "POST", "url": CHAT_URL, "body": body})
    return lines


def _file(lines: list[dict[str, Any]]) -> bytes:
    return ("\n".join(json.dumps(line) for line in lines) + "\n").encode()


def _each_alone(lines: list[dict[str, Any]], endpoint: str, scenario) -> list[int]:
    return [billed_input_tokens(endpoint, {**line, "line": n}, scenario) for n, line in enumerate(lines, start=1)]


@pytest.mark.parametrize("model", ["gpt-4o-mini", "claude-haiku-4-5", "gemini-2.5-flash", "llama-3-8b"])
@pytest.mark.parametrize(
    "scenario",
    [("normal", {}), ("skew_labels", {"label": "bug"}), ("wrong_labels", {"share": 0.5})],
    ids=["normal", "skew_labels", "wrong_labels"],
)
def test_each_request_is_billed_what_it_counts_alone(monkeypatch, model, scenario):
    monkeypatch.setattr(create_tokens, "COUNT_EVERY", 50)  # several slices, the last one short
    lines = _chat_lines(230, model, seed=len(model))
    chosen = make_scenario(*scenario)
    keeper = RequestKeeper(CHAT_URL, chosen)
    parsed = parse_input(_file(lines), CHAT_URL, keeper)
    keeper.finish()
    assert not parsed.errors
    assert [r["prompt_tokens"] for r in parsed.requests] == _each_alone(lines, CHAT_URL, chosen)
    assert [r["custom_id"] for r in parsed.requests] == [line["custom_id"] for line in lines]
    assert "body" not in parsed.requests[0]  # the bodies are not kept


def test_a_slice_held_by_its_characters_and_a_model_change_is_counted_apart(monkeypatch):
    monkeypatch.setattr(create_tokens, "COUNT_CHARS", 2_000)
    lines = _chat_lines(40, "gpt-4o-mini", seed=1) + _chat_lines(40, "claude-haiku-4-5", seed=2)
    keeper = RequestKeeper(CHAT_URL, make_scenario("normal"))
    kept = [keeper({**line, "line": n}) for n, line in enumerate(lines, start=1)]
    assert len(keeper._waiting) < 40  # counted before 40 requests were held
    keeper.finish()
    assert [k["prompt_tokens"] for k in kept] == _each_alone(lines, CHAT_URL, make_scenario("normal"))


def test_embeddings_are_counted_as_they_come_and_a_failing_batch_counts_nothing():
    lines = [
        {"custom_id": f"e{i}", "method": "POST", "url": EMBEDDINGS_URL, "body": {"model": "m", "input": ["a b c"] * i}}
        for i in range(1, 6)
    ]
    keeper = RequestKeeper(EMBEDDINGS_URL, make_scenario("normal"))
    parsed = parse_input(_file(lines), EMBEDDINGS_URL, keeper)
    assert [r["prompt_tokens"] for r in parsed.requests] == _each_alone(lines, EMBEDDINGS_URL, make_scenario("normal"))
    failing = make_scenario("fail_validation", {"lines": [1]})
    keeper = RequestKeeper(CHAT_URL, failing)
    parsed = parse_input(_file(_chat_lines(5, "gpt-4o-mini", seed=3)), CHAT_URL, keeper)
    keeper.finish()
    assert [r["prompt_tokens"] for r in parsed.requests] == [0] * 5
