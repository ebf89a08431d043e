"""The Google response parser: the column path agrees with the per-line path on every kind of line, odd blocks
fall back line by line, and another line layout (Vertex's) is read through the same functions."""

import json

import pyarrow as pa
import pytest

from batch_pipeline.core.ledger.executor import RAW_RESULT_SCHEMA, RequestPlan
from batch_pipeline.core.quality.validate import validate
from batch_pipeline.core.spec.job import OutputSpec, SamplingSpec
from batch_pipeline.executors.google.format import (
    LineLayout,
    generate_content_request,
    parse_block,
    parse_lines,
    parse_result_stream,
)

LABELS = ["billing", "bug"]


def ok(key, text, finish="STOP", **usage):
    return {
        "key": key,
        "response": {
            "candidates": [
                {"content": {"role": "model", "parts": [{"text": text}]}, "finishReason": finish, "index": 0}
            ],
            "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 3, **usage},
            "responseId": f"r-{key}",
            "modelVersion": "gemini-2.5-flash",
        },
    }


LINES = [
    ok("a", '{"label": "bug"}', cachedContentTokenCount=4),
    ok("b", '{"label": "bu', "MAX_TOKENS", thoughtsTokenCount=5),
    {
        "key": "c",
        "response": {"candidates": [{"finishReason": "SAFETY", "index": 0}], "usageMetadata": {"promptTokenCount": 10}},
    },
    {
        "key": "d",
        "response": {"promptFeedback": {"blockReason": "PROHIBITED_CONTENT"}, "usageMetadata": {"promptTokenCount": 7}},
    },
    {"key": "e", "error": {"code": 13, "message": "Internal error"}},  # a google.rpc.Status: the RPC code
    {
        "key": "f",
        "error": {
            "code": 3,
            "message": "API key not valid.",
            "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID"}],
        },
    },
    {"key": "k", "error": {"code": 429, "message": "Quota", "status": "RESOURCE_EXHAUSTED"}},  # HTTP-style
    {
        "key": "g",
        "response": {
            "candidates": [
                {
                    "content": {
                        "parts": [{"text": "hmm", "thought": True}, {"text": '{"label": '}, {"text": '"billing"}'}]
                    },
                    "finishReason": "STOP",
                }
            ]
        },
    },
    {"key": "h"},
    ok("i", '{"label": "bug"}', "RECITATION"),
    ok("j", "anything", "OTHER", promptTokenCount="12"),  # int64 as a JSON string
]
BLOCK = b"".join(json.dumps(line).encode() + b"\n" for line in LINES)


def by_key(table: pa.Table) -> dict:
    return {r["request_id"]: r for r in table.to_pylist()}


def test_the_column_path_and_the_line_path_agree_on_every_kind_of_line():
    fast, slow = parse_block(BLOCK), parse_lines(BLOCK)
    assert fast.schema == RAW_RESULT_SCHEMA and fast.to_pylist() == slow.to_pylist()
    rows = by_key(fast)
    assert [r["request_id"] for r in fast.to_pylist()] == [line.get("key") for line in LINES]  # file order
    a, b, c, d = rows["a"], rows["b"], rows["c"], rows["d"]
    assert (
        a["http_status"],
        a["finish_reason"],
        a["input_tokens"],
        a["cached_tokens"],
        a["output_tokens"],
        a["provider_request_id"],
    ) == (200, "stop", 10, 4, 3, "r-a")
    assert b["finish_reason"] == "length" and b["output_tokens"] == 3 + 5  # thinking is billed as output
    assert c["finish_reason"] == "refusal" and c["output_text"] is None and "SAFETY" in c["error_message"]
    assert d["finish_reason"] == "refusal" and "PROHIBITED_CONTENT" in d["error_message"] and d["input_tokens"] == 7
    assert (rows["e"]["http_status"], rows["e"]["error_code"]) == (500, "internal")
    assert (rows["f"]["http_status"], rows["f"]["error_code"]) == (400, "invalid_api_key")
    assert (rows["k"]["http_status"], rows["k"]["error_code"]) == (429, "resource_exhausted")
    assert rows["g"]["output_text"] == '{"label": "billing"}'  # thought parts left out
    assert rows["h"]["http_status"] is None and rows["h"]["error_code"] == "missing_result"
    assert rows["i"]["finish_reason"] == "refusal" and rows["i"]["output_text"] is None
    assert rows["j"]["finish_reason"] == "other" and rows["j"]["input_tokens"] == 12
    assert json.loads(rows["a"]["raw_payload"]) == LINES[0]


def test_the_validator_reads_truncation_refusals_and_errors_as_the_other_backends():
    verdicts = validate(parse_block(BLOCK), OutputSpec(choice=LABELS))
    status = dict(zip([line.get("key") for line in LINES], verdicts.status.to_pylist()))
    codes = dict(zip([line.get("key") for line in LINES], verdicts.error_code.to_pylist()))
    classes = dict(zip([line.get("key") for line in LINES], verdicts.error_class.to_pylist()))
    assert status["a"] == "succeeded" and status["g"] == "succeeded"
    assert status["b"] == "invalid" and codes["b"] == "truncated"
    assert status["c"] == status["d"] == status["i"] == "invalid"  # a refusal is never an answer
    assert (classes["e"], classes["f"], classes["h"], classes["k"]) == ("transient", "systemic", "poison", "transient")


@pytest.mark.parametrize(
    "odd", [b"\n\n", b"not json\n", b'{"key": "x", "response": {"candidates": [\xff]}}\n', b"[1, 2]\n"]
)
def test_an_odd_line_costs_only_itself(odd):
    block = BLOCK[: BLOCK.index(b"\n") + 1] + odd + BLOCK[BLOCK.index(b"\n") + 1 :]
    table = parse_block(block)
    good = by_key(table)
    assert good["a"]["http_status"] == 200 and good["j"]["input_tokens"] == 12
    extra = table.num_rows - len(LINES)
    assert extra == (0 if not odd.strip() else 1)
    if extra:
        assert table.filter(pa.compute.equal(table["error_code"], "unparseable_line")).num_rows == 1


def test_a_stream_cut_anywhere_parses_to_the_same_rows():
    chunks = [BLOCK[i : i + 7] for i in range(0, len(BLOCK), 7)]
    tables = list(parse_result_stream(chunks, workers=2, block_bytes=300))
    assert len(tables) > 1
    assert pa.concat_tables(tables).to_pylist() == parse_lines(BLOCK).to_pylist()


def test_another_layout_reads_a_vertex_like_line_with_the_same_functions():
    layout = LineLayout(key="$.request.labels.request_id", response="$.response", error="$.error")
    line = {"status": "", "request": {"labels": {"request_id": "k1"}, "contents": []}, "response": LINES[0]["response"]}
    table = parse_block(json.dumps(line).encode() + b"\n", layout)
    assert table.to_pylist() == parse_lines(json.dumps(line).encode(), layout).to_pylist()
    assert table.column("request_id").to_pylist() == ["k1"] and table.column("http_status").to_pylist() == [200]
    with pytest.raises(ValueError):
        LineLayout(key="key")


def test_requests_carry_the_system_instruction_and_the_output_contract():
    plan = RequestPlan(
        "gemini-2.5-flash",
        "Label it.",
        SamplingSpec(max_tokens=16, temperature=0.2, top_p=0.9, seed=7),
        OutputSpec(choice=LABELS),
    )
    body = generate_content_request(plan, "my card was charged twice")
    assert body["contents"] == [{"role": "user", "parts": [{"text": "my card was charged twice"}]}]
    assert body["systemInstruction"] == {"parts": [{"text": "Label it."}]}
    config = body["generationConfig"]
    assert config["responseMimeType"] == "application/json"
    assert config["responseJsonSchema"]["properties"]["label"]["enum"] == LABELS
    assert (config["maxOutputTokens"], config["temperature"], config["topP"], config["seed"]) == (16, 0.2, 0.9, 7)
    text = RequestPlan("m", "", SamplingSpec(max_tokens=5), OutputSpec(text={}))
    assert "systemInstruction" not in generate_content_request(text, "hi")
    assert "responseJsonSchema" not in generate_content_request(text, "hi")["generationConfig"]
