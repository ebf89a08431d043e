"""Chat turns as input (``input.messages_field``): each bad-turn kind is a reject naming the line and the field;
accepted rows are their normalised turns in canonical JSON, which the request ID hashes behind the prefix that
``prompt.examples`` is part of; JSONL (also read from an append's offset) and Parquet give the same IDs."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batch_pipeline.core.errors import ConfigError
from batch_pipeline.core.manifest import ids
from batch_pipeline.core.manifest.messages import TurnError, canonical_turns
from batch_pipeline.core.manifest.shards import Manifest, build_manifest
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.spec.loading import parse_spec
from batch_pipeline.core.store import Store

SYSTEM = "Label the ticket."
GOOD = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "hello"},
    {"role": "user", "content": "my card was charged twice"},
]

# (turns, reject kind, field named)
BAD_TURNS = {
    "not_a_list": ("hello", "wrong_type", "messages"),
    "empty_list": ([], "empty_messages", "messages"),
    "turn_not_object": (["hi"], "bad_turn", "messages[0]"),
    "no_role": ([{"content": "hi"}], "missing_field", "messages[0].role"),
    "no_content": ([{"role": "user"}], "missing_field", "messages[0].content"),
    "null_content": ([{"role": "user", "content": None}], "missing_field", "messages[0].content"),
    "number_content": ([{"role": "user", "content": 7}], "wrong_type", "messages[0].content"),
    "parts_content": (
        [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "wrong_type",
        "messages[0].content",
    ),
    "number_role": ([{"role": 1, "content": "hi"}], "wrong_type", "messages[0].role"),
    "extra_key": ([{"role": "user", "content": "hi", "name": "bob"}], "bad_turn", "messages[0]"),
    "unknown_role": ([{"role": "tool", "content": "hi"}], "unknown_role", "messages[0].role"),
    "other_system": (
        [{"role": "system", "content": "Be a pirate."}, {"role": "user", "content": "hi"}],
        "system_turn",
        "messages[0].role",
    ),
    "late_system": (
        [{"role": "user", "content": "hi"}, {"role": "system", "content": SYSTEM}],
        "system_turn",
        "messages[1].role",
    ),
    "only_system": ([{"role": "system", "content": SYSTEM}], "empty_messages", "messages"),
    "assistant_first": (
        [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "x"}],
        "turn_order",
        "messages[0].role",
    ),
    "two_users": (
        [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
        "turn_order",
        "messages[1].role",
    ),
    "ends_with_assistant": (GOOD[:2], "turn_order", "messages[1].role"),
    "blank_content": ([{"role": "user", "content": " \t\u2028 "}], "empty_text", "messages[0].content"),
}


def spec_for(path, examples=None, version="v1", fmt="auto") -> JobSpec:
    prompt = {"version": version, "system": SYSTEM}
    if examples is not None:
        prompt["examples"] = examples
    return JobSpec.model_validate(
        {
            "name": "chat",
            "input": {"path": str(path), "format": fmt, "messages_field": "messages", "key_field": "id"},
            "prompt": prompt,
            "model": "gpt-4o-mini",
            "backend": {"name": "openai_batch"},
            "sampling": {"max_tokens": 16},
            "output": {"choice": ["billing", "bug", "other"]},
        }
    )


def write_rows(path, rows) -> None:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def build(spec, home):
    store = Store(home)
    summary = build_manifest(spec, store)
    manifest = Manifest(spec.name, store)
    return summary, manifest


def ids_by_key(manifest) -> dict[str, str]:
    return {r["source_key"]: r["request_id"] for r in manifest.rows().to_pylist()}


@pytest.mark.parametrize("case", list(BAD_TURNS))
def test_each_bad_turn_kind_is_a_reject_naming_the_line_and_field(case, tmp_path):
    turns, kind, field = BAD_TURNS[case]
    write_rows(
        tmp_path / "in.jsonl",
        [{"id": "a", "messages": GOOD}, {"id": "b", "messages": turns}, {"id": "c", "messages": GOOD[2:]}],
    )
    summary, manifest = build(spec_for(tmp_path / "in.jsonl"), tmp_path / "home")
    [reject] = manifest.rejects().to_pylist()
    assert (reject["line"], reject["field"], reject["kind"]) == (2, field, kind)
    assert reject["source"].endswith("in.jsonl") and field.rsplit(".", 1)[0] in reject["reason"]
    assert summary.accepted_rows == 2 and set(ids_by_key(manifest)) == {"a", "c"}


def test_rows_without_the_field_and_broken_lines_are_rejects_too(tmp_path):
    write_rows(
        tmp_path / "in.jsonl",
        [
            {"id": "a", "messages": GOOD},
            {"id": "b", "text": "no turns"},
            '{"id": "c", "messages": [',
            '["not", "an object"]',
        ],
    )
    _, manifest = build(spec_for(tmp_path / "in.jsonl"), tmp_path / "home")
    got = [(r["line"], r["field"], r["kind"]) for r in manifest.rejects().to_pylist()]
    assert got == [(2, "messages", "missing_field"), (3, "", "bad_json"), (4, "", "not_object")]
    reasons = [r["reason"] for r in manifest.rejects().to_pylist()][1:]
    assert reasons == [
        "bad JSON: the line ends at column 26 before the JSON value is complete (cut off?)",
        "expected a JSON object, got a list",
    ]


def test_the_id_hashes_the_normalised_turns_and_the_job_system_turn_is_dropped(tmp_path):
    spaced = [{"role": t["role"], "content": f"  {t['content'].replace(' ', chr(0xA0) + ' ')}\n"} for t in GOOD]
    with_system = [{"role": "system", "content": " Label  the ticket. "}, *GOOD]
    other = [*GOOD[:2], {"role": "user", "content": "my card was charged three times"}]
    write_rows(
        tmp_path / "in.jsonl",
        [
            {"id": k, "messages": m}
            for k, m in (("plain", GOOD), ("spaced", spaced), ("system", with_system), ("other", other))
        ],
    )
    spec = spec_for(tmp_path / "in.jsonl")
    _, manifest = build(spec, tmp_path / "home")
    got = ids_by_key(manifest)
    assert got["plain"] == got["spaced"] == got["system"] != got["other"]
    canonical = json.dumps(GOOD, ensure_ascii=False, separators=(",", ":"))
    prefix = ids.id_prefix("v1", "gpt-4o-mini", spec.settings_fingerprint())
    assert got["plain"] == ids.request_id(prefix, canonical)
    [item] = [
        i for s in manifest.shard_ids() for i in manifest.shard_items(s).to_pylist() if i["request_id"] == got["plain"]
    ]
    assert item["user_prompt"] == canonical  # what every backend's request builder reads


def test_a_changed_example_changes_every_id_and_no_examples_keeps_the_ids_of_before(tmp_path):
    write_rows(
        tmp_path / "in.jsonl",
        [{"id": f"r{i}", "messages": [{"role": "user", "content": f"ticket {i}"}]} for i in range(5)],
    )
    examples = [{"role": "user", "content": "charged twice"}, {"role": "assistant", "content": "billing"}]
    changed = [examples[0], {"role": "assistant", "content": "bug"}]
    runs = {}
    for name, ex in (("none", None), ("empty", []), ("a", examples), ("b", changed)):
        _, manifest = build(spec_for(tmp_path / "in.jsonl", ex), tmp_path / name)
        runs[name] = ids_by_key(manifest)
    assert runs["none"] == runs["empty"]
    for left, right in (("none", "a"), ("a", "b")):
        assert all(runs[left][k] != runs[right][k] for k in runs[left]), (left, right)
    assert spec_for(tmp_path, examples).settings_fingerprint() != spec_for(tmp_path, changed).settings_fingerprint()


def test_parquet_turns_and_a_jsonl_append_give_the_same_ids(tmp_path):
    rows = [{"id": f"r{i}", "messages": [{"role": "user", "content": f"ticket  {i}"}]} for i in range(6)]
    write_rows(tmp_path / "in.jsonl", rows[:3])
    jsonl_spec = spec_for(tmp_path / "in.jsonl")
    store = Store(tmp_path / "home")
    build_manifest(jsonl_spec, store)
    with (tmp_path / "in.jsonl").open("a") as f:  # grown: the next generation reads from the old end
        f.write("".join(json.dumps(r) + "\n" for r in rows[3:]))
    summary = build_manifest(jsonl_spec, store)
    assert summary.new_requests == 3
    from_jsonl = ids_by_key(Manifest("chat", store))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in.parquet")
    _, manifest = build(spec_for(tmp_path / "in.parquet"), tmp_path / "home_pq")
    assert ids_by_key(manifest) == from_jsonl and len(from_jsonl) == 6


def test_canonical_turns_is_the_one_rule():
    assert canonical_turns(GOOD, "m", SYSTEM) == json.dumps(GOOD, separators=(",", ":"))
    assert canonical_turns([{"role": "user", "content": "Ünï"}], "m", "") == '[{"role":"user","content":"Ünï"}]'
    with pytest.raises(TurnError) as err:
        canonical_turns([{"role": "user", "content": "\ud800"}], "m", "")
    assert err.value.kind == "bad_utf8"


SPEC = """
name: chat
input: {{path: in.jsonl, {input}}}
prompt: {{version: v1, system: s{prompt}}}
model: gpt-4o-mini
backend: {{name: openai_batch}}
sampling: {{max_tokens: 16}}
output: {{choice: [a, b]}}
"""


@pytest.mark.parametrize(
    "input_, prompt, message",
    [
        ("text_field: body, messages_field: messages", ', template: "{body}"', "exactly one of input.text_field"),
        ("key_field: id", ', template: "{body}"', "exactly one of input.text_field"),
        ("messages_field: messages", ', template: "{body}"', "prompt.template is not used"),
        ("messages_field: messages, format: csv", "", "needs JSONL, Parquet or openai_batch"),
        ("messages_field: messages", ", examples: [{role: assistant, content: x}]", "examples[0] must be a user turn"),
        ("messages_field: messages", ", examples: [{role: user, content: x}]", "last example must be an assistant"),
        (
            "messages_field: messages",
            ", examples: [{role: system, content: x}, {role: assistant, content: y}]",
            "examples.0.role",
        ),
        (
            "messages_field: messages",
            ", examples: [{role: user, content: ''}, {role: assistant, content: y}]",
            "examples.0.content",
        ),
    ],
)
def test_the_spec_says_what_is_wrong_with_a_messages_job(input_, prompt, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_spec(SPEC.format(input=input_, prompt=prompt))


def test_a_messages_job_parses_and_golden_records_are_refused():
    spec = parse_spec(
        SPEC.format(
            input="messages_field: messages",
            prompt=", examples: [{role: user, content: x}, {role: assistant, content: a}]",
        )
    )
    assert spec.input.text_field is None and [t.role for t in spec.prompt.examples] == ["user", "assistant"]
    with pytest.raises(ConfigError, match="quality"):
        parse_spec(SPEC.format(input="messages_field: messages", prompt="") + "quality: {golden: g.jsonl}\n")


def test_the_examples_count_in_every_items_token_estimate_and_the_quotes_fixed_part(tmp_path):
    import polars as pl

    from batch_pipeline.core.money.estimate import request_tokens

    write_rows(tmp_path / "in.jsonl", [{"id": "r", "messages": GOOD}])
    long = [{"role": "user", "content": "a long example ticket " * 50}, {"role": "assistant", "content": "billing"}]
    est = {}
    for name, ex in (("without", None), ("with", long)):
        spec = spec_for(tmp_path / "in.jsonl", ex)
        _, manifest = build(spec, tmp_path / name)
        [item] = [i for s in manifest.shard_ids() for i in manifest.shard_items(s).to_pylist()]
        est[name] = (
            item["est_input_tokens"],
            request_tokens(
                spec,
                pl.DataFrame({"user_prompt": [item["user_prompt"]], "est_input_tokens": [item["est_input_tokens"]]}),
            ),
        )
    extra_bytes = len("".join(t["content"] for t in long).encode())
    assert est["with"][0] - est["without"][0] >= extra_bytes // 5  # the manifest's estimate
    assert est["with"][1].system_tokens - est["without"][1].system_tokens >= 100  # the quote's, by the tokenizer
