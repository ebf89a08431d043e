"""Structural validation against the output contract, and the result rows built from it."""

import json
from datetime import date

import pyarrow as pa
import pytest

from batch_pipeline.core.errors import ErrorClass
from batch_pipeline.core.ledger.executor import RequestPlan, ShardWork
from batch_pipeline.core.ledger.result_parts import RESULT_SCHEMA, read_results, write_results
from batch_pipeline.core.pricing.cost import Price
from batch_pipeline.core.quality.validate import validate
from batch_pipeline.core.run.results import build_results
from batch_pipeline.core.spec.contract_floor import choice_schema
from batch_pipeline.core.spec.job import OutputSpec, SamplingSpec
from batch_pipeline.core.store import Store
from batch_pipeline_tests.core.helpers import raw_results

LABELS = ["billing", "bug", "feature_request"]
CHOICE = OutputSpec(choice=LABELS)
SCHEMA = OutputSpec(
    json_schema={
        "type": "object",
        "properties": {
            "sentiment": {"type": "string", "enum": ["pos", "neg"]},
            "score": {"type": "number", "minimum": 0, "maximum": 1},
            "tags": {
                "type": "array",
                "items": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
            },
        },
        "required": ["sentiment", "score"],
        "additionalProperties": False,
    }
)
TEXT = OutputSpec(text={})


def ok(text, finish="stop", **kw):
    return {"request_id": kw.pop("rid", "r"), "http_status": 200, "output_text": text, "finish_reason": finish, **kw}


def verdicts(rows, output):
    v = validate(raw_results(rows), output)
    return list(
        zip(
            v.status.to_pylist(),
            v.parsed_output.to_pylist(),
            v.error_class.to_pylist(),
            v.error_code.to_pylist(),
            v.error_message.to_pylist(),
        )
    )


# -- choice ---------------------------------------------------------------------------------------
def test_choice_bare_labels_all_good_fast_path():
    got = verdicts([ok("billing"), ok(" bug\n"), ok("feature_request")], CHOICE)
    assert [(s, p) for s, p, *_ in got] == [
        ("succeeded", "billing"),
        ("succeeded", "bug"),
        ("succeeded", "feature_request"),
    ]
    assert all(e is None for *_, e in got)


@pytest.mark.parametrize(
    "text,expected",
    [
        ("billing", "billing"),
        ('{"label": "bug"}', "bug"),
        ('  {"label": "feature_request"}  ', "feature_request"),
        ('"billing"', "billing"),
        ("Billing", None),
        ("refund", None),
        ('{"label": "refund"}', None),
        ('{"category": "bug"}', None),
        ('["bug"]', None),
        ("", None),
        (None, None),
    ],
)
def test_choice_outputs(text, expected):
    # a neighbour that needs the JSON path, so both paths are exercised for every case
    rows = [ok(text, rid="x"), ok('{"label": "billing"}', rid="y")]
    (status, parsed, eclass, ecode, emsg), second = verdicts(rows, CHOICE)
    assert second[:2] == ("succeeded", "billing")
    if expected is None:
        assert (status, parsed, eclass, ecode) == (
            "invalid",
            None,
            ErrorClass.INVALID_OUTPUT.value,
            "contract_violation",
        )
        assert emsg
    else:
        assert (status, parsed, eclass, ecode, emsg) == ("succeeded", expected, None, None, None)
    # and alone (the all-bare-labels fast path when it applies)
    alone = verdicts([ok(text)], CHOICE)[0]
    assert alone[:2] == (status, parsed)


def _choice_columns_by_regex(texts: pa.Array, labels: list[str]) -> tuple[list, list]:
    """What the column path settled before the exact-form lookup: a regex capture, then a lookup of it."""
    import pyarrow.compute as pc

    allowed = pa.array(labels, pa.string())
    bare = pc.fill_null(pc.is_in(texts, value_set=allowed), False)
    pattern = r'^\{"label": ?"(?P<label>[^"\\\x00-\x1f]*)"\}$'
    label = pc.struct_field(pc.extract_regex(texts, pattern), "label")
    in_object = pc.fill_null(pc.is_in(label, value_set=allowed), False)
    settled = pc.or_(bare, in_object)
    return settled.to_pylist(), pc.if_else(settled, pc.if_else(bare, texts, label), None).to_pylist()


def test_choice_columns_equal_the_regex_and_the_per_row_parser():
    from batch_pipeline.core.quality.validate import _choice_columns, _parse_choice, _plain_labels

    labels = ["billing", "bug", "feature request", "café", "日本", "a{b}", "bug"]  # a duplicate, braces, unicode
    assert _plain_labels(labels)
    texts = [None, "", "billing", "Billing", " billing", "billing\n", "bug", "feature request", "café", "日本"]
    for label in ["bug", "café", "日本", "a{b}", "feature request", "spam", "", "bu"]:
        texts += [
            f'{{"label":"{label}"}}',
            f'{{"label": "{label}"}}',
            f'{{"label":  "{label}"}}',
            f'{{ "label":"{label}"}}',
            f'{{"label":"{label}"}} ',
            f'{{"label":"{label}"}}\n',
            f'{{"label":"{label}" }}',
            f'{{"Label":"{label}"}}',
            f'{{"label":"{label}","why":"x"}}',
            f'"{label}"',
        ]
    arr = pa.array(texts, pa.string())
    settled, value = _choice_columns(arr, labels)
    want_settled, want_value = _choice_columns_by_regex(arr, labels)
    assert settled.to_pylist() == want_settled
    assert value.filter(settled).to_pylist() == [v for v, s in zip(want_value, want_settled) if s]
    # every settled row is one the per-row parser accepts, with the same label
    parsed = _parse_choice([t for t, s in zip(texts, want_settled) if s], set(labels))
    assert [v for v, s in zip(want_value, want_settled) if s] == [v for v, _ in parsed]
    assert all(err is None for _, err in parsed)
    assert sum(want_settled) == 2 + 3 + 5 * 2  # bare: billing, bug, feature request, café, 日本; two forms each


def test_truncated_output_is_invalid_even_with_a_valid_label():
    got = verdicts(
        [ok("billing", finish="length"), ok('{"label": "bug"}', finish="length"), ok("bug", finish="stop")], CHOICE
    )
    assert [g[0] for g in got] == ["invalid", "invalid", "succeeded"]
    assert got[0][1:4] == (None, ErrorClass.INVALID_OUTPUT.value, "truncated")
    assert "finish_reason=length" in got[0][4]


def test_choice_schema_enforces_the_label_set():
    import jsonschema

    schema = choice_schema(LABELS)
    jsonschema.validate({"label": "bug"}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"label": "nope"}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"label": "bug", "why": "x"}, schema)


# -- errors ---------------------------------------------------------------------------------------
def test_non_200_rows_are_errored_with_their_class():
    rows = [
        {"request_id": "a", "http_status": 500, "error_code": "server_error", "error_message": "boom"},
        {"request_id": "b", "http_status": 401, "error_code": "invalid_api_key"},
        {"request_id": "c", "http_status": 400, "error_code": "context_length_exceeded", "error_message": "too long"},
        {"request_id": "d", "http_status": None, "error_code": "batch_expired"},
        {"request_id": "e", "http_status": None},
        {"request_id": "f", "http_status": 429},
    ]
    got = verdicts(rows, CHOICE)
    assert [g[0] for g in got] == ["errored"] * 6
    assert [g[2] for g in got] == ["transient", "systemic", "poison", "transient", "poison", "transient"]
    assert [g[3] for g in got] == [
        "server_error",
        "invalid_api_key",
        "context_length_exceeded",
        "batch_expired",
        "no_response",
        "http_429",
    ]
    assert got[0][4] == "boom" and got[4][4] == "no response for this request"


def test_repeated_errors_are_classified_as_each_row_alone():
    from batch_pipeline.core.errors import classify_line_error

    kinds = [
        (500, "server_error", "boom"),
        (401, "invalid_api_key", None),
        (400, "context_length_exceeded", "too long"),
        (None, "batch_expired", None),
        (None, None, None),
        (429, None, "slow down"),
        (400, "context_length_exceeded", "other words"),
    ]
    rows = [
        {"request_id": f"r{i}", "http_status": h, "error_code": c, "error_message": m}
        for i, (h, c, m) in enumerate(kinds[(i * 5) % len(kinds)] for i in range(50))
    ]
    got = verdicts([*rows, ok("bug")], CHOICE)
    want = [classify_line_error(r["error_code"], r["http_status"], r["error_message"]).value for r in rows]
    assert [g[2] for g in got] == [*want, None]


# -- json_schema ----------------------------------------------------------------------------------
def test_json_schema_valid_objects_are_canonicalised():
    got = verdicts(
        [ok('{"score": 0.5, "sentiment": "pos"}'), ok('{"sentiment":"neg","score":1,"tags":[{"name":"x"}]}')], SCHEMA
    )
    assert [g[0] for g in got] == ["succeeded", "succeeded"]
    assert json.loads(got[0][1]) == {"score": 0.5, "sentiment": "pos"}
    assert got[0][1] == json.dumps({"score": 0.5, "sentiment": "pos"}, sort_keys=True)


@pytest.mark.parametrize(
    "text,path",
    [
        ('{"sentiment": "pos", "score": 2}', "score"),
        ('{"sentiment": "meh", "score": 0.1}', "sentiment"),
        ('{"sentiment": "pos", "score": 0.1, "tags": [{"name": "a"}, {"nom": "b"}]}', "tags/1"),
        ('{"sentiment": "pos", "score": 0.1, "tags": [{"name": 5}]}', "tags/0/name"),
        ('{"sentiment": "pos"}', "<root>"),
        ('{"sentiment": "pos", "score": 0.1, "extra": 1}', "<root>"),
        ("[1, 2]", "<root>"),
    ],
)
def test_json_schema_invalid_objects_name_the_path(text, path):
    [(status, parsed, eclass, ecode, emsg)] = verdicts([ok(text)], SCHEMA)
    assert (status, parsed, eclass, ecode) == ("invalid", None, "invalid_output", "contract_violation")
    assert f"fails the schema at {path}:" in emsg


def test_json_schema_not_json():
    [(status, _, _, _, emsg)] = verdicts([ok('{"sentiment": "pos", "score":')], SCHEMA)
    assert status == "invalid" and "not JSON" in emsg
    [(status, _, _, _, _)] = verdicts([ok('{"sentiment": "pos", "score": 0.2}', finish="length")], SCHEMA)
    assert status == "invalid"


# -- text -----------------------------------------------------------------------------------------
def test_text_outputs():
    got = verdicts([ok("a summary."), ok("   \n"), ok(None), ok("cut", finish="length")], TEXT)
    assert [g[:2] for g in got] == [
        ("succeeded", "a summary."),
        ("invalid", None),
        ("invalid", None),
        ("invalid", None),
    ]
    assert [g[3] for g in got] == [None, "contract_violation", "contract_violation", "truncated"]


def test_empty_table():
    assert verdicts([], CHOICE) == []
    assert verdicts([], SCHEMA) == []


# -- result rows ----------------------------------------------------------------------------------
def test_build_results_stamps_cost_and_provenance(tmp_path):
    plan = RequestPlan(model="m-1", system="sys", sampling=SamplingSpec(max_tokens=8), output=CHOICE)
    work = ShardWork("job", "s00001", 2, "job:s00001:2", plan, pa.table({"request_id": ["a", "b", "c"]}))
    price = Price(
        input_per_mtok=0.15,
        cached_input_per_mtok=0.075,
        output_per_mtok=0.6,
        batch_discount=0.5,
        checked=date(2026, 1, 1),
    )
    raw = raw_results(
        [
            ok("billing", rid="a", input_tokens=1000, cached_tokens=400, output_tokens=2, raw_payload="{}"),
            ok("nope", rid="b", input_tokens=900, cached_tokens=None, output_tokens=3),
            {"request_id": "c", "http_status": 500, "error_code": "server_error"},
        ]
    )
    table = build_results(
        raw,
        work,
        backend="openai_batch",
        pricing="batch",
        prompt_version="v1",
        price=price,
        provider_batch_id="batch_1",
    )
    assert table.schema == RESULT_SCHEMA
    rows = table.to_pylist()
    assert [r["status"] for r in rows] == ["succeeded", "invalid", "errored"]
    assert [r["parsed_output"] for r in rows] == ["billing", None, None]
    assert {(r["shard_id"], r["attempt"], r["model"], r["prompt_version"], r["provider_batch_id"]) for r in rows} == {
        ("s00001", 2, "m-1", "v1", "batch_1")
    }
    assert rows[0]["cost_usd"] == pytest.approx(price.cost(1000, 2, 400, batch=True))
    assert rows[1]["cost_usd"] == pytest.approx(price.cost(900, 3, 0, batch=True))
    assert rows[0]["cost_usd"] == pytest.approx((600 * 0.15 + 400 * 0.075 + 2 * 0.6) / 1e6 * 0.5)
    assert rows[2]["cost_usd"] == 0 and rows[2]["input_tokens"] == 0
    assert rows[2]["error_code"] == "server_error" and rows[1]["error_code"] == "contract_violation"

    online = build_results(
        raw, work, backend="online", pricing="online", prompt_version="v1", price=price, provider_batch_id=None
    )
    assert online.column("cost_usd")[0].as_py() == pytest.approx(price.cost(1000, 2, 400, batch=False))

    store = Store(tmp_path)
    write_results(store, "job", "s00001", 2, 1, table)
    back = read_results(store, "job", "s00001")
    assert sorted(back["request_id"].to_list()) == ["a", "b", "c"]
    assert back.filter(back["request_id"] == "a")["parsed_output"].to_list() == ["billing"]
