"""Gemini inline batches (``batches.create(src=[...])``, sent as ``inputConfig.requests.requests``) through the real
google-genai SDK against a sandbox process: answered in the operation as ``dest.inlined_responses`` (input order,
``response`` or ``error``, the request's ``metadata``), refused over the API's 20 MiB payload limit with its
error, billed once like a file batch and counted in the same enqueued-token quota."""

from __future__ import annotations

import json
import time

import httpx2
import pytest
from google.genai import errors, types

from ..support import assert_never_over, load_events
from .test_gemini_api import SCHEMA, client, jsonl, upload

MODEL = "gemini-2.5-flash"
LIMIT = 20 * 2**20  # 20,971,520 bytes: "Request payload size exceeds the limit: 20971520 bytes."
TICKETS = [f"My invoice {i} was charged twice and the parcel never came." for i in range(4)]


def inline(text: str, key: str | None = None, **config) -> dict:
    """One inline request as a user writes it for the SDK (an ``InlinedRequest`` dict)."""
    request: dict = {"contents": [{"role": "user", "parts": [{"text": text}]}]}
    if key is not None:
        request["metadata"] = {"key": key}
    if config:
        request["config"] = config
    return request


def labelled(prompts: list[str]) -> list[dict]:
    """The requests of ``jsonl(prompts)`` as inline requests: the same prompt tokens, so the same quota load."""
    return [
        inline(
            p,
            f"k{i}",
            system_instruction="Label the ticket.",
            response_mime_type="application/json",
            response_json_schema=SCHEMA,
            max_output_tokens=32,
        )
        for i, p in enumerate(prompts)
    ]


def wait(c, job: types.BatchJob) -> types.BatchJob:
    for _ in range(500):
        job = c.batches.get(name=job.name)
        if job.done:
            return job
        time.sleep(0.02)
    raise AssertionError("the batch never ended")


def raw(url: str, name: str) -> dict:
    return httpx2.get(f"{url}/v1/{name}", headers={"x-goog-api-key": "k"}, timeout=60).json()


def test_inline_requests_are_answered_in_the_operation_in_input_order(admin, sandbox_proc):
    url = sandbox_proc[1]
    c = client(url)
    src = [
        inline(
            "I was charged twice on my billing statement",
            "bill",
            response_mime_type="application/json",
            response_json_schema=SCHEMA,
        ),
        inline("[[sandbox:poison]] too long", "poisoned"),
        inline(
            "a bug: the app crashes on start", "bug", response_mime_type="application/json", response_json_schema=SCHEMA
        ),
        inline("no metadata on this one"),
        inline("[[sandbox:refuse]] something", "refused"),
    ]
    admin.clock(freeze=True)
    job = c.batches.create(model=MODEL, src=src, config={"display_name": "inline:s1:1"})
    assert job.state == types.JobState.JOB_STATE_PENDING and job.display_name == "inline:s1:1"
    pending = raw(url, job.name)
    assert "inputConfig" not in pending["metadata"]  # the live API does not echo inline requests back
    assert pending["metadata"]["batchStats"] == {"requestCount": "5", "pendingRequestCount": "5"}
    admin.clock(advance_s=1.0)  # past validating, in progress and finalizing
    job = wait(c, job)
    assert job.state == types.JobState.JOB_STATE_SUCCEEDED and job.dest.file_name is None
    answers = job.dest.inlined_responses
    assert [a.metadata for a in answers] == [
        {"key": "bill"},
        {"key": "poisoned"},
        {"key": "bug"},
        None,
        {"key": "refused"},
    ]  # every request, in input order
    assert [a.response is not None for a in answers] == [True, False, True, True, True]
    assert all((a.response is None) != (a.error is None) for a in answers)
    assert json.loads(answers[0].response.text) == {"label": "billing"}
    assert json.loads(answers[2].response.text) == {"label": "bug"}
    assert answers[3].response.text.startswith("Sandbox reply to: no metadata")
    assert answers[4].response.candidates[0].finish_reason == types.FinishReason.SAFETY
    assert answers[1].error.code == 3 and "poison" in answers[1].error.message  # INVALID_ARGUMENT, inline
    assert all(a.response.usage_metadata.prompt_token_count > 0 for a in answers if a.response)
    done = raw(url, job.name)
    assert done["metadata"]["batchStats"] == {
        "requestCount": "5",
        "successfulRequestCount": "4",
        "failedRequestCount": "1",
    }
    assert done["response"]["inlinedResponses"] == done["metadata"]["output"]["inlinedResponses"]
    assert set(done["response"]["inlinedResponses"]["inlinedResponses"][1]) == {"error", "metadata"}
    # billed once, when the batch ended: the four answers, under metadata.key or (without one) a request digest
    ledger = [e for e in admin.ledger() if e["batch_id"] == job.name]
    assert len(ledger) == 4 and {e["provider"] for e in ledger} == {"gemini"}
    ids = {e["custom_id"] for e in ledger}
    assert {"bill", "bug", "refused"} < ids and "poisoned" not in ids
    (keyless,) = ids - {"bill", "bug", "refused"}
    assert keyless.startswith("request-")
    by_id = {e["custom_id"]: e for e in ledger}
    assert by_id["bill"]["input_tokens"] == answers[0].response.usage_metadata.prompt_token_count
    assert by_id["bill"]["output_tokens"] == answers[0].response.usage_metadata.candidates_token_count
    c.batches.get(name=job.name)
    assert len([e for e in admin.ledger() if e["batch_id"] == job.name]) == 4  # reading again bills nothing
    # listed, the responses are left out (as the live list does); the batch's own get carries them
    (listed,) = list(c.batches.list())
    assert listed.name == job.name and listed.state == types.JobState.JOB_STATE_SUCCEEDED
    assert listed.dest is not None and not listed.dest.inlined_responses


def test_line_errors_come_back_inline_without_the_details_the_sdk_cannot_read(admin, sandbox_proc):
    c = client(sandbox_proc[1])
    admin.set_scenario("line_errors", rate=1.0, times=1, code="invalid_api_key")
    job = wait(c, c.batches.create(model=MODEL, src=[inline("hello", "a"), inline("there", "b")]))
    errors_ = [a.error for a in job.dest.inlined_responses]
    assert [(e.code, e.details) for e in errors_] == [(3, None), (3, None)]  # JobError.details is list[str]
    assert admin.ledger() == []  # nothing answered, nothing billed
    job = wait(c, c.batches.create(model=MODEL, src=[inline("hello", "a"), inline("there", "b")]))
    assert [a.error for a in job.dest.inlined_responses] == [None, None]  # the same keys, seen a second time
    assert len(admin.ledger()) == 2


def test_a_cancel_keeps_what_was_answered_and_expiry_returns_nothing(admin, sandbox_proc):
    c = client(sandbox_proc[1])
    admin.set_scenario("slow", in_progress_s=3600)
    job = c.batches.create(model=MODEL, src=[inline(f"ticket {i}", f"t{i}") for i in range(4)])
    admin.clock(advance_s=1800.05)  # half of the requests answered
    c.batches.cancel(name=job.name)
    job = wait(c, job)
    assert job.state == types.JobState.JOB_STATE_CANCELLED
    kept = [a.metadata["key"] for a in job.dest.inlined_responses]
    assert len(kept) == 2 and kept == sorted(kept)  # only what was answered, still in input order
    assert sorted(e["custom_id"] for e in admin.ledger()) == kept
    admin.set_scenario("expire", complete_share=0.5)
    job = wait(c, c.batches.create(model=MODEL, src=[inline(f"ticket {i}", f"e{i}") for i in range(4)]))
    assert job.state == types.JobState.JOB_STATE_EXPIRED and job.dest is None  # no answers at all
    assert {e["custom_id"] for e in admin.ledger()} == set(kept)  # the expired batch billed nothing


def test_inline_requests_over_the_20_mib_payload_limit_are_refused(admin, sandbox_proc):
    url = sandbox_proc[1]
    c = client(url)
    with pytest.raises(errors.ClientError) as caught:  # the SDK's own create, a little over the limit
        c.batches.create(model=MODEL, src=[inline("x" * (LIMIT // 4), f"big{i}") for i in range(4)])
    assert (caught.value.code, caught.value.status) == (400, "INVALID_ARGUMENT")
    assert caught.value.message == "Request payload size exceeds the limit: 20971520 bytes."
    assert list(c.batches.list()) == [] and admin.load()["events"] == []  # nothing created, nothing held

    def body(size: int) -> bytes:
        """A create body of exactly ``size`` bytes: one short request whose ``metadata`` carries the padding."""

        def encode(pad: str) -> bytes:
            item = {
                "request": {"contents": [{"role": "user", "parts": [{"text": "hello"}]}]},
                "metadata": {"key": "edge", "pad": pad},
            }
            return json.dumps(
                {"batch": {"displayName": "edge", "inputConfig": {"requests": {"requests": [item]}}}},
                separators=(",", ":"),
            ).encode()

        data = encode("x" * (size - len(encode(""))))
        assert len(data) == size
        return data

    endpoint = f"{url}/v1/models/{MODEL}:batchGenerateContent"
    headers = {"x-goog-api-key": "k", "content-type": "application/json"}
    over = httpx2.post(endpoint, content=body(LIMIT + 1), headers=headers, timeout=60)
    assert over.status_code == 400 and over.json()["error"] == {
        "code": 400,
        "message": "Request payload size exceeds the limit: 20971520 bytes.",
        "status": "INVALID_ARGUMENT",
    }
    at = httpx2.post(endpoint, content=body(LIMIT), headers=headers, timeout=60)
    assert at.status_code == 200 and at.json()["metadata"]["state"] == "BATCH_STATE_PENDING"  # exactly the limit
    c.batches.delete(name=at.json()["name"])


def test_an_inline_batch_is_counted_in_the_enqueued_token_quota_like_a_file_batch(admin, sandbox_proc):
    url = sandbox_proc[1]
    c = client(url, key="g-inline")
    probe = wait(c, c.batches.create(model=MODEL, src=upload(c, jsonl(TICKETS)).name))
    tokens = sum(e["input_tokens"] for e in admin.ledger() if e["batch_id"] == probe.name)
    assert tokens > 0
    admin.reset()
    admin.set_scenario("normal", quota_enqueued_tokens=tokens, in_progress_s=10.0)
    admin.clock(freeze=True)
    held = c.batches.create(model=MODEL, src=upload(c, jsonl(TICKETS)).name)  # a file batch takes the whole cap
    with pytest.raises(errors.ClientError) as caught:
        c.batches.create(model=MODEL, src=labelled(TICKETS))
    assert (caught.value.code, caught.value.status) == (429, "RESOURCE_EXHAUSTED")
    assert (
        f"Limit: {tokens} enqueued tokens ({tokens} enqueued in batches pending or running, {tokens} in this "
        "batch)" in caught.value.message
    )  # the inline batch counts exactly what the file batch does
    admin.clock(advance_s=11.0)  # the file batch ends and frees its tokens
    assert c.batches.get(name=held.name).state == types.JobState.JOB_STATE_SUCCEEDED
    accepted = c.batches.create(model=MODEL, src=labelled(TICKETS))  # exactly the cap: accepted
    with pytest.raises(errors.ClientError) as again:
        c.batches.create(model=MODEL, src=upload(c, jsonl(TICKETS)).name)  # and it holds the cap in turn
    assert again.value.code == 429
    admin.clock(advance_s=11.0)
    job = c.batches.get(name=accepted.name)
    assert job.state == types.JobState.JOB_STATE_SUCCEEDED and len(job.dest.inlined_responses) == len(TICKETS)
    load = admin.load()
    assert assert_never_over(load, "gemini", "tokens", tokens) == tokens
    events = load_events(load, "gemini")
    assert [e["event"] for e in events] == ["enqueue", "refuse", "release", "enqueue", "refuse", "release"]
    assert [e["batch_id"] for e in events if e["event"] == "enqueue"] == [held.name, accepted.name]
    assert {(e["account"], e["model"]) for e in events} == {("g-inline", MODEL)} and load["refusals"] == 2
    inline_ledger = [e for e in admin.ledger() if e["batch_id"] == accepted.name]
    assert sorted(e["custom_id"] for e in inline_ledger) == [f"k{i}" for i in range(len(TICKETS))]
    assert sum(e["input_tokens"] for e in inline_ledger) == tokens  # billed as the file batch was
