"""The contract floor: the shortest valid answer of an output contract, its token floor, and the spec check
that refuses a ``sampling.max_tokens`` below it (at load, before any spend)."""

import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batch_pipeline.core.errors import ConfigError
from batch_pipeline.core.ledger.executor import RequestPlan
from batch_pipeline.core.quality.validate import validate
from batch_pipeline.core.spec.contract_floor import (
    BARE,
    CHOICE_FORMS,
    WRAPPED,
    answer_floor,
    choice_schema,
    min_answer_tokens,
    shortest_answer,
    token_floor,
)
from batch_pipeline.core.spec.job import OutputSpec
from batch_pipeline.core.spec.loading import load_spec, parse_spec
from batch_pipeline_tests.core.helpers import DEMO_SPEC, REPO, raw_results

LABELS = ["billing", "bug", "feature_request", "account", "other"]


def schema_output(schema: dict) -> OutputSpec:
    return OutputSpec(json_schema=schema)


# -- choice ---------------------------------------------------------------------------------------------
def test_choice_bare_is_the_shortest_label():
    out = OutputSpec(choice=LABELS)
    assert shortest_answer(out) == "bug"
    assert shortest_answer(out, "vllm") == "bug"
    assert min_answer_tokens(out, "vllm") == 1


@pytest.mark.parametrize("backend", ["openai_batch", "online", "anthropic_batch"])
def test_choice_on_a_json_backend_counts_the_wrapper(backend):
    out = OutputSpec(choice=LABELS)
    assert shortest_answer(out, backend) == '{"label":"bug"}'
    assert answer_floor(out, backend) == ('{"label":"bug"}', 5)  # {"  label  ":"  bug  "}


def test_an_unknown_backend_counts_as_bare_the_lower_form():
    assert CHOICE_FORMS.get("someone_elses_backend") is None
    assert min_answer_tokens(OutputSpec(choice=LABELS), "someone_elses_backend") == 1


def test_the_choice_form_table_matches_what_each_backend_sends():
    """WRAPPED backends enforce the label set with ``choice_schema`` (so the answer is ``{"label": ...}``)."""
    from batch_pipeline.executors.anthropic import format as anthropic_format
    from batch_pipeline.executors.openai import format as openai_format
    from batch_pipeline.executors.registry import names

    assert set(CHOICE_FORMS) <= set(names())
    plan = RequestPlan(
        model="m", system="", sampling=parse_spec(spec_text(16)).sampling, output=OutputSpec(choice=LABELS)
    )
    assert openai_format.response_format(plan)["json_schema"]["schema"] == choice_schema(LABELS)  # batch, online
    assert anthropic_format.output_schema(plan) == choice_schema(LABELS)
    assert CHOICE_FORMS["openai_batch"] == CHOICE_FORMS["online"] == CHOICE_FORMS["anthropic_batch"] == WRAPPED
    assert CHOICE_FORMS["vllm"] == BARE  # structured_outputs.choice: the bare label (vllm_prompts.sampling_params)


def test_the_fewest_tokens_label_need_not_be_the_shortest():
    out = OutputSpec(choice=["a-b", "abcd"])
    assert shortest_answer(out) == "a-b"
    assert answer_floor(out) == ("abcd", 1)  # "a-b" is two pieces: a, -b


def test_text_has_a_one_token_floor():
    out = OutputSpec(text={})
    assert shortest_answer(out) == ""
    assert answer_floor(out, "openai_batch") == ("", 1)


# -- json schema ----------------------------------------------------------------------------------------
def test_only_required_properties_in_required_order():
    schema = {
        "type": "object",
        "required": ["score", "label"],
        "properties": {"label": {"type": "string"}, "score": {"type": "integer"}, "note": {"type": "string"}},
    }
    assert shortest_answer(schema_output(schema)) == '{"score":0,"label":""}'
    assert shortest_answer(schema_output({"type": "object", "properties": {"a": {"type": "string"}}})) == "{}"


def test_scalars_bounds_and_lengths():
    props = {
        "s": {"type": "string", "minLength": 3},
        "i": {"type": "integer", "minimum": 5},
        "j": {"type": "integer", "exclusiveMinimum": 5},
        "k": {"type": "integer", "maximum": -2},
        "m": {"type": "integer", "minimum": 7, "multipleOf": 5},
        "x": {"type": "number", "exclusiveMinimum": 0.5},
        "y": {"type": "number", "minimum": 0.25, "maximum": 0.75},
        "b": {"type": "boolean"},
        "n": {"type": "null"},
        "t": {"type": ["string", "null"]},
    }
    schema = {"type": "object", "properties": props, "required": list(props)}
    answer = shortest_answer(schema_output(schema))
    assert answer == ('{"s":"aaa","i":5,"j":6,"k":-2,"m":10,"x":1,"y":0.25,"b":false,"n":null,"t":""}')
    jsonschema.validate(json.loads(answer), schema)


def test_nested_objects_enum_const_and_arrays_with_min_items():
    schema = {
        "type": "object",
        "required": ["label", "meta", "tags", "kind"],
        "properties": {
            "label": {"type": "string", "enum": ["urgent", "low", "medium"]},
            "kind": {"const": "ticket"},
            "meta": {
                "type": "object",
                "required": ["score"],
                "properties": {"score": {"type": "integer", "minimum": 1}, "why": {"type": "string"}},
            },
            "tags": {
                "type": "array",
                "minItems": 2,
                "items": {"type": "object", "required": ["k"], "properties": {"k": {"enum": ["xy", "z"]}}},
            },
        },
    }
    answer = shortest_answer(schema_output(schema))
    assert answer == '{"label":"low","meta":{"score":1},"tags":[{"k":"z"},{"k":"z"}],"kind":"ticket"}'
    jsonschema.validate(json.loads(answer), schema)


def test_refs_to_defs_and_definitions():
    schema = {
        "type": "object",
        "required": ["a", "b"],
        "properties": {"a": {"$ref": "#/$defs/pair"}, "b": {"$ref": "#/definitions/flag"}},
        "$defs": {"pair": {"type": "array", "minItems": 2, "items": {"$ref": "#/definitions/flag"}}},
        "definitions": {"flag": {"type": "boolean"}},
    }
    answer = shortest_answer(schema_output(schema))
    assert answer == '{"a":[false,false],"b":false}'
    jsonschema.validate(json.loads(answer), schema)


def test_a_recursive_ref_takes_the_branch_that_ends():
    schema = {
        "type": "object",
        "required": ["root"],
        "properties": {"root": {"$ref": "#/$defs/node"}},
        "$defs": {
            "node": {
                "type": "object",
                "required": ["next"],
                "properties": {"next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}},
            }
        },
    }
    answer = shortest_answer(schema_output(schema))
    assert answer == '{"root":{"next":null}}'
    jsonschema.validate(json.loads(answer), schema)


def test_any_of_and_one_of_take_the_shortest_branch():
    schema = {
        "type": "object",
        "required": ["a", "b", "c"],
        "properties": {
            "a": {
                "anyOf": [{"type": "string", "minLength": 4}, {"type": "integer", "minimum": 10000}, {"type": "null"}]
            },
            "b": {
                "oneOf": [
                    {"type": "object", "required": ["x"], "properties": {"x": {"type": "boolean"}}},
                    {"type": "array", "minItems": 1, "items": {"type": "integer"}},
                ]
            },
            "c": {
                "allOf": [
                    {"type": "object", "required": ["p"], "properties": {"p": {"type": "integer"}}},
                    {"required": ["q"], "properties": {"q": {"type": "boolean"}}},
                ]
            },
        },
    }
    answer = shortest_answer(schema_output(schema))
    assert answer == '{"a":null,"b":[0],"c":{"p":0,"q":false}}'
    jsonschema.validate(json.loads(answer), schema)


def test_the_brief_example_and_its_floor():
    schema = {
        "type": "object",
        "required": ["label", "score"],
        "properties": {"label": {"type": "string"}, "score": {"type": "integer"}},
    }
    assert shortest_answer(schema_output(schema)) == '{"label":"","score":0}'
    assert min_answer_tokens(schema_output(schema), "openai_batch") == 7  # {"  label  ":"","  score  ":  0  }


# -- the token floor ------------------------------------------------------------------------------------
# Token counts measured with OpenAI's cl100k_base and o200k_base encodings (gpt-4o-mini, the demo's model, uses
# o200k_base). The floor must not exceed either.
MEASURED = {
    '{"label":"bug"}': (5, 5),
    '{"label":"feature_request"}': (6, 6),
    '{"label": "billing"}': (6, 6),
    '{"label":"","score":0}': (7, 7),
    '{"a":[false,null,"aaaa"],"n":-12345}': (13, 15),
    '{"tags":[{"k":"x"},{"k":"x"}]}': (12, 13),
    "feature_request": (2, 2),
    "Sandbox reply to: hello world.": (8, 7),
    "it's a don't-care": (6, 4),
}


@pytest.mark.parametrize("text", list(MEASURED))
def test_token_floor_is_at_most_the_measured_bpe_count(text):
    assert 1 <= token_floor(text) <= min(MEASURED[text])


def test_token_floor_is_tight_on_compact_json():
    assert token_floor('{"label":"bug"}') == 5
    assert token_floor('{"label":"","score":0}') == 7


# -- property: the minimal instance validates ----------------------------------------------------------
NAMES = st.sampled_from(["a", "b", "label", "score", "x_y"])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-50, 50), st.text("abz_-", max_size=4))


@st.composite
def number_schemas(draw, kind: str = "integer") -> dict:
    """Bounds that leave room for a value: integers for ``integer``, quarters for ``number``."""
    unit = 1 if kind == "integer" else 0.25
    schema: dict = {"type": kind}
    low = draw(st.none() | st.integers(-20, 20).map(lambda v: v * unit))
    if low is not None:
        schema["exclusiveMinimum" if draw(st.booleans()) else "minimum"] = low
    if draw(st.booleans()):
        high = (low if low is not None else -5) + draw(st.integers(2, 6)) * unit
        schema["exclusiveMaximum" if draw(st.booleans()) else "maximum"] = high
    return schema


LEAVES = st.one_of(
    st.builds(lambda n: {"type": "string", "minLength": n}, st.integers(0, 3)),
    st.just({"type": "string"}),
    number_schemas(),
    number_schemas("number"),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.builds(lambda values: {"enum": values}, st.lists(SCALARS, min_size=1, max_size=4, unique_by=json.dumps)),
    st.builds(lambda value: {"const": value}, SCALARS),
)
# oneOf branches of distinct types, so the shortest one cannot also match another
ONE_OF = st.lists(
    st.sampled_from([{"type": "string"}, {"type": "integer"}, {"type": "boolean"}, {"type": "null"}]),
    min_size=1,
    max_size=4,
    unique_by=json.dumps,
).map(lambda bs: {"oneOf": bs})


def objects(children) -> st.SearchStrategy:
    return st.dictionaries(NAMES, children, max_size=4).flatmap(
        lambda props: st.lists(st.sampled_from(sorted(props)) if props else st.nothing(), unique=True).map(
            lambda req: {"type": "object", "properties": props, "required": req}
        )
    )


SCHEMAS = st.recursive(
    LEAVES | ONE_OF,
    lambda children: st.one_of(
        objects(children),
        st.builds(lambda item, n: {"type": "array", "items": item, "minItems": n}, children, st.integers(0, 3)),
        st.lists(children, min_size=1, max_size=3).map(lambda bs: {"anyOf": bs}),
    ),
    max_leaves=8,
)


@st.composite
def root_schemas(draw) -> dict:
    """An object schema whose properties are small schemas or ``$ref``s to ``$defs``/``definitions``."""
    where = draw(st.sampled_from(["$defs", "definitions"]))
    defs = draw(st.dictionaries(st.sampled_from(["d1", "d2"]), SCHEMAS, max_size=2))
    refs = [{"$ref": f"#/{where}/{name}"} for name in sorted(defs)]
    children = SCHEMAS | st.sampled_from(refs) if refs else SCHEMAS
    root = draw(objects(children))
    if defs:
        root[where] = defs
    return root


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(root_schemas())
def test_the_minimal_instances_validate_against_their_schema(schema):
    validator = jsonschema.Draft202012Validator(schema)
    out = schema_output(schema)
    shortest = shortest_answer(out)
    fewest, tokens = answer_floor(out, "openai_batch")
    for answer in (shortest, fewest):
        errors = list(validator.iter_errors(json.loads(answer)))
        assert not errors, (answer, errors[0].message)
    assert answer == json.dumps(json.loads(answer), separators=(",", ":"), ensure_ascii=False)  # compact
    assert 1 <= tokens <= token_floor(shortest)


# -- the spec check -------------------------------------------------------------------------------------
def spec_text(max_tokens: int, output: str = "  choice: [billing, bug, other]\n", extra: str = "") -> str:
    # line numbers matter: sampling.max_tokens is on line 8
    return (
        "name: floor_check\n"
        "input: {path: data/samples/tickets/*.jsonl, text_field: body}\n"
        'prompt: {version: v1, template: "Ticket:\\n{body}"}\n'
        "model: gpt-4o-mini\n"
        "backend: {name: openai_batch}\n"
        "sampling:\n"
        "  temperature: 0\n"
        f"  max_tokens: {max_tokens}\n"
        "output:\n"
        f"{output}{extra}"
    )


JSON_OUTPUT = (
    "  json_schema:\n    type: object\n    required: [label, score]\n"
    "    properties: {label: {type: string}, score: {type: integer}}\n"
)


def test_a_max_tokens_below_the_floor_is_a_config_error_naming_file_line_and_field(tmp_path: Path):
    path = tmp_path / "data" / "jobs" / "floor_check.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(spec_text(4, JSON_OUTPUT))
    with pytest.raises(ConfigError) as exc:
        load_spec(path)
    message = str(exc.value)
    assert message.startswith(f"{path}: invalid job spec (1 problem(s))"), message
    problem = next(line for line in message.splitlines() if "field 'sampling.max_tokens'" in line)
    assert re.search(r"\bline 8\b", problem), problem
    assert (
        "sampling.max_tokens 4 cannot fit the shortest valid answer of the output contract on openai_batch "
        '(`{"label":"","score":0}`, about 7 tokens); raise it to at least 7'
    ) in problem


def test_the_error_comes_through_parse_spec_too():
    with pytest.raises(ConfigError) as exc:
        parse_spec(spec_text(4), "jobs/x.yaml")
    assert str(exc.value).startswith("jobs/x.yaml: invalid job spec")
    assert (
        "line 8, field 'sampling.max_tokens': Value error, sampling.max_tokens 4 cannot fit the shortest valid "
        'answer of the output contract on openai_batch (`{"label":"bug"}`, about 5 tokens); raise it to at least 5 '
        "(got 4)"
    ) in str(exc.value)


def test_a_max_tokens_that_fits_exactly_passes():
    assert parse_spec(spec_text(5)).sampling.max_tokens == 5  # {"label":"bug"}: 5
    assert parse_spec(spec_text(7, JSON_OUTPUT)).sampling.max_tokens == 7
    with pytest.raises(ConfigError, match="at least 7"):
        parse_spec(spec_text(6, JSON_OUTPUT))


def test_text_output_never_trips_the_check():
    assert parse_spec(spec_text(1, "  text: {}\n")).output.kind == "text"


def test_every_backend_that_sends_the_requests_is_checked():
    bare = spec_text(2).replace("{name: openai_batch}", "{name: vllm}")
    assert parse_spec(bare).backend.name == "vllm"  # a bare label fits in 2
    with pytest.raises(ConfigError, match="on online .*at least 5"):  # the tail rescue wraps the label
        parse_spec(bare + "tail: {backend: {name: online}}\n")
    with pytest.raises(ConfigError, match="on online .*at least 5"):  # and so do the golden evals
        parse_spec(bare + "quality: {golden: g.jsonl}\n")


def test_every_spec_in_data_jobs_loads():
    from batch_pipeline.core.spec.loading import load_specs

    assert load_specs(REPO / "data" / "jobs")


# -- the demo --------------------------------------------------------------------------------------------
# the demo's answers, {"label": "<label>"}, measured with o200k_base (gpt-4o-mini): compact, and as the
# sandbox writes them (json.dumps defaults)
DEMO_O200K = {"billing": (5, 6), "bug": (5, 6), "feature_request": (6, 7), "account": (5, 6), "other": (5, 6)}


def test_the_floor_never_exceeds_the_demo_jobs_real_answers():
    from batch_pipeline.executors.openai.format import body_settings, chat_messages
    from batch_pipeline.sandbox.responder import chat_completion

    spec = load_spec(DEMO_SPEC)
    floor = min_answer_tokens(spec.output, spec.backend.name)
    assert floor == 5 and spec.sampling.max_tokens >= floor
    assert set(DEMO_O200K) == set(spec.output.choice)
    assert floor <= min(min(counts) for counts in DEMO_O200K.values())

    plan = RequestPlan.from_spec(spec)
    golden = [json.loads(line) for line in (REPO / "data" / "golden" / "demo.jsonl").read_text().splitlines()[:40]]
    rows = []
    for i, row in enumerate(golden):
        user = spec.prompt.template.format(**{f: row[f] for f in spec.prompt.fields})
        body = {**body_settings(plan), "messages": chat_messages(plan, user)}
        done = chat_completion(body, completion_id=f"c{i}", created=0, cached_tokens=0)
        choice = done.body["choices"][0]
        assert choice["finish_reason"] == "stop"
        assert floor <= done.completion_tokens  # the sandbox's own count, what the demo is billed
        assert floor <= token_floor(choice["message"]["content"])
        rows.append(
            {
                "request_id": f"r{i}",
                "http_status": 200,
                "output_text": choice["message"]["content"],
                "finish_reason": "stop",
                "output_tokens": done.completion_tokens,
            }
        )
    assert set(validate(raw_results(rows), spec.output).status.to_pylist()) == {"succeeded"}


def test_the_demo_spec_is_refused_below_its_floor(tmp_path: Path):
    data = yaml.safe_load(DEMO_SPEC.read_text())
    data["sampling"]["max_tokens"] = 4
    path = tmp_path / "data" / "jobs" / "demo.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ConfigError, match=r"sampling.max_tokens 4 cannot fit .*raise it to at least 5"):
        load_spec(path)
