"""``POST /v1/chat/completions`` (online) with the real openai SDK: contract, markers, scenarios, rate limits."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest

from batch_pipeline.sandbox import SandboxAdmin
from batch_pipeline.sandbox.openai.chat import format_duration

from ..support import MODEL, validate_spec

CHAT = "/v1/chat/completions"
LABELS = ["billing", "bug", "feature_request", "other"]
LABEL_FORMAT: dict[str, Any] = {
    "type": "json_schema",
    "json_schema": {
        "name": "label",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {"label": {"type": "string", "enum": LABELS}},
            "required": ["label"],
            "additionalProperties": False,
        },
    },
}
RATE_HEADERS = [
    f"x-ratelimit-{what}-{kind}" for kind in ("requests", "tokens") for what in ("limit", "remaining", "reset")
]


def ask(client: openai.OpenAI, text: str, **body: Any) -> Any:
    """One raw chat completion (the body is checked against the OpenAPI document)."""
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "system", "content": "Label it."}, {"role": "user", "content": text}], **body
    )
    validate_spec("CreateChatCompletionResponse", json.loads(raw.text))
    return raw


def chat_log(admin: SandboxAdmin) -> list[dict[str, Any]]:
    return [r for r in admin.requests() if r["path"] == CHAT]


def test_completion_contract_headers_and_label(client: openai.OpenAI, admin: SandboxAdmin) -> None:
    raw = ask(client, "I was charged twice: a billing problem.", response_format=LABEL_FORMAT, max_tokens=20)
    completion = raw.parse()
    assert completion.object == "chat.completion" and completion.model == MODEL
    assert completion.id.startswith("chatcmpl-") and completion.system_fingerprint == "sandbox"
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    answer = json.loads(choice.message.content or "")
    jsonschema.validate(answer, LABEL_FORMAT["json_schema"]["schema"])
    assert answer == {"label": "billing"}
    usage = completion.usage
    assert usage is not None and usage.prompt_tokens > 0 and usage.completion_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert raw.headers["x-request-id"].startswith("req_") and raw.headers["x-sandbox"]
    for name in RATE_HEADERS:
        assert raw.headers[name], name
    assert int(raw.headers["x-ratelimit-remaining-requests"]) == int(raw.headers["x-ratelimit-limit-requests"]) - 1
    # deterministic content: the same request gives the same answer
    again = ask(client, "I was charged twice: a billing problem.", response_format=LABEL_FORMAT, max_tokens=20)
    assert again.parse().choices[0].message.content == choice.message.content


def test_plain_text_and_json_object_formats(client: openai.OpenAI, admin: SandboxAdmin) -> None:
    text = ask(client, "hello there sandbox").parse().choices[0].message.content
    assert text == "Sandbox reply to: hello there sandbox."
    obj = ask(client, "hi", response_format={"type": "json_object"}).parse().choices[0].message.content
    assert json.loads(obj or "") == {"sandbox": True, "answer": "hi"}


def test_max_tokens_and_truncate_marker_give_finish_reason_length(client: openai.OpenAI, admin: SandboxAdmin) -> None:
    cut = ask(client, "one two three four five six seven eight", max_tokens=2).parse()
    assert cut.choices[0].finish_reason == "length" and cut.usage is not None and cut.usage.completion_tokens == 2
    cut2 = ask(client, "please [[sandbox:truncate]] this", max_completion_tokens=50).parse()
    assert cut2.choices[0].finish_reason == "length"


def test_poison_marker_is_a_400_and_is_not_billed(client: openai.OpenAI, admin: SandboxAdmin) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        ask(client, "bad [[sandbox:poison]] row")
    assert err.value.code == "context_length_exceeded" and err.value.response.headers["x-request-id"]
    assert [r["status"] for r in chat_log(admin)] == [400]  # the SDK does not retry a 400
    assert admin.ledger() == []


def test_auth_and_missing_parameters(client: openai.OpenAI, sandbox_url: str, admin: SandboxAdmin) -> None:
    bad = openai.OpenAI(base_url=sandbox_url + "/v1", api_key="sk-sandbox-bad", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as err:
        bad.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    assert err.value.code == "invalid_api_key"
    with pytest.raises(openai.BadRequestError) as err2:
        client.chat.completions.create(model=MODEL, messages=[])
    assert err2.value.code == "missing_required_parameter"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="", messages=[{"role": "user", "content": "x"}])


def test_every_200_is_billed_once_as_online(client: openai.OpenAI, admin: SandboxAdmin) -> None:
    ids = [ask(client, f"question {i}").parse().id for i in range(3)]
    ledger = admin.ledger()
    assert [e["completion_id"] for e in ledger] == ids
    assert all(e["mode"] == "online" and e["batch_id"] is None and e["model"] == MODEL for e in ledger)
    assert all(e["input_tokens"] > 0 and e["output_tokens"] > 0 and e["cached_tokens"] == 0 for e in ledger)
    keys = [r["request_key"] for r in chat_log(admin)]
    assert len(set(keys)) == 3 and keys == [e["request_key"] for e in ledger]


def test_long_system_prompt_is_cached_the_second_time(client: openai.OpenAI, admin: SandboxAdmin) -> None:
    system = "Rules: " + "label tickets carefully " * 400
    usages = []
    for i in range(2):
        done = client.chat.completions.create(
            model=MODEL, messages=[{"role": "system", "content": system}, {"role": "user", "content": f"t{i}"}]
        )
        assert done.usage is not None and done.usage.prompt_tokens_details is not None
        usages.append(done.usage.prompt_tokens_details.cached_tokens)
    assert usages[0] == 0 and usages[1] >= 1024


def test_rate_limit_scenario_on_chat_completions(client: openai.OpenAI, admin: SandboxAdmin) -> None:
    admin.set_scenario("rate_limit", times=2, retry_after_ms=150, on=["chat_completions"])
    assert ask(client, "hi").parse().choices[0].finish_reason == "stop"  # the SDK waits out two 429s
    log = chat_log(admin)
    assert [r["status"] for r in log] == [429, 429, 200] and [r["retry_count"] for r in log] == [0, 1, 2]
    assert len({r["request_key"] for r in log}) == 1
    for before, after in zip(log, log[1:]):
        assert after["monotonic"] - before["monotonic"] >= 0.15
    admin.set_scenario("rate_limit", times=1, retry_after_ms=1500, on=["chat_completions"])
    no_retry = client.with_options(max_retries=0)
    with pytest.raises(openai.RateLimitError) as err:
        no_retry.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    headers = err.value.response.headers
    assert headers["retry-after-ms"] == "1500" and headers["retry-after"] == "2"
    assert err.value.code == "rate_limit_exceeded"


def test_server_error_scenario_on_chat_completions(client: openai.OpenAI, admin: SandboxAdmin) -> None:
    admin.set_scenario("server_error", times=1, on=["chat_completions"])
    with pytest.raises(openai.InternalServerError):
        client.with_options(max_retries=0).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}]
        )
    assert ask(client, "x").parse().choices  # the next call succeeds
    assert len(admin.ledger()) == 1


def test_line_errors_fail_a_request_the_first_times_it_is_seen(client: openai.OpenAI, admin: SandboxAdmin) -> None:
    admin.set_scenario("line_errors", rate=1.0, times=2)
    plain = client.with_options(max_retries=0)
    messages = [{"role": "user", "content": "same question"}]
    for _ in range(2):
        with pytest.raises(openai.InternalServerError):
            plain.chat.completions.create(model=MODEL, messages=messages)
    # a request is identified by its messages: other settings do not make it a new request
    assert plain.chat.completions.create(model=MODEL, messages=messages, max_tokens=9).choices
    with pytest.raises(openai.InternalServerError):
        plain.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "another one"}])
    admin.set_scenario("line_errors", rate=0.0)
    assert plain.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "third"}]).choices


def test_rpm_limit_answers_429_until_the_clock_minute_ends(client: openai.OpenAI, admin: SandboxAdmin) -> None:
    admin.set_scenario("normal", rpm=3)
    admin.clock(freeze=True)
    plain = client.with_options(max_retries=0)
    remaining = [ask(plain, f"q{i}").headers["x-ratelimit-remaining-requests"] for i in range(3)]
    assert remaining == ["2", "1", "0"]
    with pytest.raises(openai.RateLimitError) as err:
        ask(plain, "q4")
    headers = err.value.response.headers
    assert err.value.code == "rate_limit_exceeded" and err.value.body["type"] == "requests"  # type: ignore[index]
    assert 0 < int(headers["retry-after-ms"]) <= 60_000 and headers["x-ratelimit-limit-requests"] == "3"
    admin.clock(advance_s=60)
    assert ask(plain, "q5").headers["x-ratelimit-remaining-requests"] == "2"
    assert len(admin.ledger()) == 4


def test_tpm_limit_counts_prompt_and_max_tokens(client: openai.OpenAI, admin: SandboxAdmin) -> None:
    admin.set_scenario("normal", tpm=100)
    admin.clock(freeze=True)
    plain = client.with_options(max_retries=0)
    first = ask(plain, "short", max_tokens=40)
    used = 100 - int(first.headers["x-ratelimit-remaining-tokens"])
    assert used >= 40 and first.headers["x-ratelimit-limit-tokens"] == "100"
    with pytest.raises(openai.RateLimitError) as err:
        ask(plain, "short", max_tokens=100 - used + 1)
    assert err.value.body["type"] == "tokens"  # type: ignore[index]


def test_rate_limit_params_are_validated(admin: SandboxAdmin, sandbox_url: str) -> None:
    import urllib.error

    with pytest.raises(urllib.error.HTTPError) as err:
        admin.set_scenario("normal", rpm=0)
    assert err.value.code == 400
    assert admin.set_scenario("server_error", on=["chat_completions"], rpm=50)["params"]["rpm"] == 50


@pytest.mark.parametrize("seconds, text", [(0.12, "120ms"), (1.5, "1.5s"), (59.0, "59s"), (360, "6m0s")])
def test_reset_durations_are_written_like_openai(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
