"""The request bytes a batch uploads: ``RequestPlan.row_turns_json`` escapes with ``json.encoder.encode_basestring``
(no encoder built per request) and ``RequestPlan.request_lines`` builds a whole file column-wise in Polars. Both must
stay byte for byte what ``json.dumps(..., ensure_ascii=False)`` made, one line at a time."""

import json

import pyarrow as pa
import pytest

from batch_pipeline.core.ledger.executor import ItemShape, RequestPlan, _joined
from batch_pipeline.core.spec.job import OutputSpec

TRICKY = [
    "",
    "plain ascii",
    'quotes " and \\ backslashes / slash',
    "controls \x00\x01\x08\x0b\x0c\x1f\x7f tab\t nl\n cr\r",
    "line sep \u2028 para \u2029 nbsp \xa0 bom \ufeff c1 \x80\x85\x9f",
    "accents éàü, CJK 漢字, emoji 😀👍🏽, RTL שלום",
    "Text:\n" + "ünïcödé " * 500,
]
HEAD, MID, TAIL = '{"custom_id":"', '","body":{"model":"m","messages":[{"role":"system","content":"s"},', "]}}"


def _plan(shape: ItemShape = ItemShape.TEXT) -> RequestPlan:
    return RequestPlan(model="m", system="s", sampling=None, output=OutputSpec(choice=["a", "b"]), shape=shape)


def _one_by_one(plan: RequestPlan, items: pa.Table) -> bytes:
    """The lines as the executors made them before: one f-string per request, joined, encoded."""
    rows = zip(items.column("request_id").to_pylist(), items.column("user_prompt").to_pylist())
    lines = [f"{HEAD}{rid}{MID}{plan.row_turns_json(prompt)}{TAIL}" for rid, prompt in rows]
    return ("\n".join(lines) + "\n").encode("utf-8")


def test_row_turns_json_is_json_dumps_byte_for_byte():
    plan = _plan()
    for text in TRICKY:
        expected = '{"role":"user","content":' + json.dumps(text, ensure_ascii=False) + "}"
        assert plan.row_turns_json(text) == expected
        assert json.loads("[" + plan.row_turns_json(text) + "]") == plan.row_turns(text)


@pytest.mark.parametrize("shape", [ItemShape.TEXT, ItemShape.TURNS])
def test_request_lines_are_the_one_by_one_lines(shape):
    plan = _plan(shape)
    prompts = TRICKY
    if shape is ItemShape.TURNS:  # canonical turns JSON, as the manifest holds it
        prompts = [
            json.dumps([{"role": "user", "content": t}], ensure_ascii=False, separators=(",", ":")) for t in TRICKY
        ]
        prompts.append("[]")
    items = pa.table({"request_id": [f"id{i:03d}" for i in range(len(prompts))], "user_prompt": prompts})
    expected = _one_by_one(plan, items)
    assert plan.request_lines(HEAD, MID, TAIL, items) == expected
    chunked = pa.concat_tables([items.slice(0, 3), items.slice(3)])  # two chunks, the second an offset slice
    assert plan.request_lines(HEAD, MID, TAIL, chunked) == expected
    assert plan.request_lines(HEAD, MID, TAIL, items.slice(2, 3)) == _one_by_one(plan, items.slice(2, 3))
    assert plan.request_lines(HEAD, MID, TAIL, items.slice(0, 0)) == b""
    for line in expected.decode().split("\n")[
        : -1 if shape is ItemShape.TEXT else -2
    ]:  # "[]": no turns, a dangling comma  # one JSON document a line (str.splitlines would cut at U+2028)
        assert json.loads(line)["custom_id"].startswith("id")


def test_request_lines_with_a_null_prompt_fall_back_to_one_by_one():
    plan = _plan()
    items = pa.table({"request_id": ["a", "b"], "user_prompt": pa.array(["x", None], pa.string())})
    assert plan.request_lines(HEAD, MID, TAIL, items) == _one_by_one(plan, items)


def test_joined_copes_with_values_that_are_not_contiguous():
    whole = pa.array(["ab", "cde", "f"], pa.large_string())
    assert _joined(whole) == b"abcdef" and _joined(whole.slice(1)) == b"cdef"
    gappy = pa.LargeStringArray.from_buffers(  # offsets that skip bytes of the data buffer
        2, pa.py_buffer(pa.array([0, 2, 4, 7], pa.int64()).buffers()[1].to_pybytes()[8:]), pa.py_buffer(b"xxabyyc")
    )
    assert _joined(gappy) == b"".join(v.encode() for v in gappy.to_pylist())
    assert _joined(pa.chunked_array([["a"], ["bc"]], pa.string())) == b"abc"
