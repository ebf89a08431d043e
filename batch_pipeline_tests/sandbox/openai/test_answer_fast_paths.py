"""The per-line shortcuts of a batch's answers write what the generic code wrote: the templated output line and
body, the schema count kept by ``repr``, the cached label words and hints, and the markers found once."""

from __future__ import annotations

import json
import random
import re
from typing import Any

import pytest

from batch_pipeline.sandbox.batches import LineResult
from batch_pipeline.sandbox.openai.spooled_results import SpooledResults
from batch_pipeline.sandbox.responder import _dumps, chat_completion, last_user_text, markers, read_chat, system_text
from batch_pipeline.sandbox.schema_fill import SchemaFiller, _find_word, fill_schema, label_hints, pick_label
from batch_pipeline.sandbox.spooled_parts import encode
from batch_pipeline.sandbox.tokens import count_tokens, input_tokens, schema_tokens

SCHEMA = {"type": "object", "properties": {"label": {"type": "string", "enum": ["billing", "bug_report", "x"]}}}


def _body(text: str, **extra: Any) -> dict[str, Any]:
    messages = [{"role": "system", "content": "Label it."}, {"role": "user", "content": text}]
    return {"model": extra.pop("model", "gpt-4o-mini"), "messages": messages, **extra}


BODIES = [
    _body("my invoice was charged twice"),
    _body('a bug report \u00e9\u00e8 \u2603 "quoted" \\ back\nslash', response_format={"type": "json_object"}),
    _body("a bug, then a report", response_format={"type": "json_schema", "json_schema": {"schema": SCHEMA}}),
    _body("refuse this [[sandbox:refuse]]", max_tokens=2),
    _body("cut me [[sandbox:truncate]] please, in half", max_completion_tokens=50),
    _body("odd model", model='gpt "4" \u00fcber'),
    _body("", max_tokens=0),
]


@pytest.mark.parametrize("body", BODIES)
@pytest.mark.parametrize("cached", [0, 1024])
def test_templated_body_is_the_encoded_body(body: dict[str, Any], cached: int) -> None:
    completion = chat_completion(
        body, completion_id="chatcmpl-1", created=1_700_000_000, cached_tokens=cached, truncate="cut" in str(body)
    )
    assert completion.body_json == encode(completion.body)


def test_a_body_with_numbers_of_another_type_falls_back_to_the_encoder() -> None:
    completion = chat_completion(
        BODIES[0],
        completion_id="chatcmpl-1",
        created=1_700_000_000,
        cached_tokens=0,
        prompt_tokens=12.0,  # type: ignore[arg-type]
    )
    assert completion.body_json is None  # the line is then encoded from the dict


def test_templated_output_line_is_the_encoded_line(tmp_path: Any) -> None:
    fast, slow = SpooledResults(tmp_path, "batch_a"), SpooledResults(tmp_path, "batch_b")
    for n, body in enumerate(BODIES):
        completion = chat_completion(body, completion_id=f"c{n}", created=7, cached_tokens=0)
        args = (n, f"id \u00e9 {n}", 200, f"req_{n}", completion.body)
        fast.append(LineResult(*args, body_json=completion.body_json, input_tokens=completion.prompt_tokens))
        slow.append(LineResult(*args, input_tokens=completion.prompt_tokens))
    fast.flush()
    slow.flush()
    lines = fast.path("output").read_text(encoding="utf-8").splitlines()
    # batch ids differ, so line ids do: compare each line with its own dict encoded
    assert len(lines) == len(BODIES)
    for text in lines:
        assert encode(json.loads(text)) == text
    assert [json.loads(t)["response"] for t in lines] == [
        json.loads(t)["response"] for t in slow.path("output").read_text(encoding="utf-8").splitlines()
    ]


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": {"type": "integer", "minimum": 1}}},
        {"properties": {"a": {"minimum": 1, "type": "integer"}}, "type": "object"},  # equal, other key order
        {"type": "object", "properties": {"a": {"type": "integer", "minimum": 1.0}}},  # equal, 1.0 for 1
        {"type": "object", "properties": {"a": {"type": "integer", "minimum": True}}},  # equal, True for 1
    ],
)
@pytest.mark.parametrize("model", ["gpt-4o-mini", "llama-3-8b"])
def test_schema_count_is_the_count_of_its_own_json(schema: dict[str, Any], model: str) -> None:
    body = {"model": model, "response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}
    for _ in range(2):  # counted, then kept
        assert schema_tokens(body) == input_tokens(json.dumps(schema), model)


def test_label_words_and_hints_are_found_as_before() -> None:
    options = ["billing", "bug_report", "other thing"]
    assert pick_label(options, "a report about a bug") == "bug_report"  # all its words, not the label itself
    assert pick_label(options, "thing, and another thing") in options  # no label, no word run: by hash
    assert pick_label(options, "the other thing, then a bug report") == "other thing"  # the earliest wins
    hints = label_hints("billing (invoice, charge) bug_report (crash)")
    assert hints == {"billing": ["invoic", "charge"], "bug_report": ["crash"]}
    assert label_hints("billing (invoice, charge) bug_report (crash)") == hints
    assert pick_label(options, "it will crash", hints=hints) == "bug_report"


READ_BODIES = [
    *BODIES,
    {"messages": [{"role": "user", "content": "a [[sandbox:poison]]"}, {"role": "user", "content": "b"}]},
    {"messages": [{"role": "developer", "content": "x (y)"}, "odd", {"role": "system", "content": [{"text": "z"}]}]},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "p [[sandbox:refuse]]"}, "q"]}, 7, None]},
    {"messages": "not a list"},
    {},
]


@pytest.mark.parametrize("body", READ_BODIES, ids=range(len(READ_BODIES)))
def test_a_body_read_once_is_what_the_readers_find_one_by_one(body: dict[str, Any]) -> None:
    reading = read_chat(body)
    assert reading.user_text == last_user_text(body)
    assert reading.system_text == system_text(body)
    assert reading.marks == markers(body)
    args: dict[str, Any] = {"completion_id": "c", "created": 1, "cached_tokens": 0}
    assert chat_completion(body, reading=reading, **args) == chat_completion(body, **args)


def test_a_reading_passed_in_gives_the_same_answer() -> None:
    body = BODIES[3]
    args: dict[str, Any] = {"completion_id": "c", "created": 1, "cached_tokens": 0}
    assert chat_completion(body, reading=read_chat(body), **args) == chat_completion(body, **args)
    assert chat_completion(body, **args).body["choices"][0]["message"]["refusal"] is not None


def test_count_tokens_counts_word_runs_and_marks() -> None:
    assert count_tokens('{"label": "bug_report"}') == 9  # { " label " : " bug_report " }
    assert count_tokens("") == 0


@pytest.mark.parametrize("whole", [True, False])
def test_a_word_is_found_where_the_word_boundary_regex_finds_it(whole: bool) -> None:
    """``_find_word`` (``str.find`` and a look at each occurrence's neighbours) against the regex it replaced,
    ``(?<!\\w)needle(?!\\w)``, on texts of word characters of every kind (digits, ``_``, accented and title-case
    letters, other numbers), marks that are not word characters, spaces and punctuation."""
    rng = random.Random(7)
    alphabet = ["a", "b", "ab", "_", "1", "é", "ǅ", "²", "½", "\u0301", " ", "-", ".", "\n", "bug", "bill"]
    for _ in range(3_000):
        haystack = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        needle = "".join(rng.choice(alphabet[:12]) for _ in range(rng.randint(1, 3)))
        regex = re.compile(r"(?<!\w)" + re.escape(needle) + (r"(?!\w)" if whole else ""))
        match = regex.search(haystack)
        assert _find_word(haystack, needle, whole) == (match.start() if match else None), (haystack, needle)


_ENUM = {"type": "string", "enum": ["billing", "bug_report", "other"]}
FILL_SCHEMAS = [
    SCHEMA,
    {"type": "object", "properties": {"label": _ENUM, "urgency": {"enum": ["low", "high"]}}, "required": ["label"]},
    {"properties": {"label": _ENUM}, "additionalProperties": False},  # an object by its properties
    {"type": ["object", "null"], "properties": {"label": _ENUM}},
    {"type": "object", "properties": {}},
    {"type": "object"},
    # near misses: each is some other fill
    {"type": "object", "properties": {"label": {**_ENUM, "const": "other"}}},
    {"type": "object", "properties": {"label": {"$ref": "#/$defs/l", "enum": ["a"]}}, "$defs": {"l": {"enum": ["b"]}}},
    {"type": "object", "properties": {"label": {"anyOf": [_ENUM, {"type": "null"}], "enum": ["z"]}}},
    {"type": "object", "properties": {"label": _ENUM, "note": {"type": "string"}}},
    {"type": "object", "properties": {"label": {"enum": "not a list"}}},
    {"type": "object", "properties": {"label": _ENUM}, "allOf": [{"properties": {"x": {"enum": [1, 2]}}}]},
    {"type": "object", "properties": {"label": _ENUM}, "anyOf": [{"type": "string"}]},
    {"type": "object", "properties": {"label": _ENUM}, "enum": [{"label": "bug_report"}]},
    {"type": "object", "properties": {"label": _ENUM}, "const": {"label": "x"}},
    {"type": "string", "properties": {"label": _ENUM}},
    {"type": "object", "properties": {"label": True}},
]


@pytest.mark.parametrize("schema", FILL_SCHEMAS, ids=range(len(FILL_SCHEMAS)))
def test_a_choice_schema_is_filled_as_the_generic_filler_fills_it(schema: dict[str, Any]) -> None:
    """``fill_schema``'s shortcut for an object of plain enums gives what ``SchemaFiller``'s walk gives, for texts
    that name a label, name none, or steer one, with and without label descriptions; any other schema is walked."""
    rng = random.Random(11)
    instructions = ["", "billing (invoice, refund) bug_report (crash, error) other (anything else)"]
    for _ in range(60):
        words = rng.choices(["my", "invoice", "Crash", "BUG", "report", "low", "HIGH", "urgent", "\u00e9t\u00e9"], k=8)
        text = " ".join(words) + rng.choice(["", " [[sandbox:label=other]]", " [[sandbox:label=not:billing]]"])
        for said in instructions:
            assert fill_schema(schema, text, said) == SchemaFiller(schema, text, label_hints(said)).fill()


@pytest.mark.parametrize(
    "value",
    [{}, {"label": "bug_report"}, {"a": '\u00e9\u2603 "q" \\ \n\t\x00', "b\u2028": ""}, {"n": 1}, {"b": True}, ["x"]],
)
def test_an_answer_of_strings_is_encoded_as_the_encoder_encodes_it(value: Any) -> None:
    assert _dumps(value) == json.dumps(value, ensure_ascii=False)
