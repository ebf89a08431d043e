"""Gemini's enqueued-token quota through the real google-genai SDK: ``batches.create`` past
``quota_enqueued_tokens`` (per key and model, over pending and running batches) is a 429 RESOURCE_EXHAUSTED with
RetryInfo, exactly past the cap and not at it; the load frees when a batch ends; a refused batch bills nothing."""

from __future__ import annotations

import re

import pytest
from google.genai import errors

from batch_pipeline.sandbox import SandboxAdmin

from ..support import assert_never_over, load_events
from .test_gemini_api import client, jsonl, run, upload

MODEL = "gemini-2.5-flash"
DATA = jsonl([f"My invoice {i} was charged twice and the parcel never came." for i in range(6)])


def tokens_of(url: str, admin: SandboxAdmin) -> int:
    """The prompt tokens the sandbox bills for ``DATA`` (a probe batch); the sandbox is reset after."""
    job = run(client(url), DATA)
    tokens = sum(e["input_tokens"] for e in admin.ledger() if e["batch_id"] == job.name)
    assert tokens > 0
    admin.reset()
    return tokens


def create(c, name: str = "q"):
    return c.batches.create(model=MODEL, src=upload(c, DATA).name, config={"display_name": name})


def test_a_create_past_the_enqueued_tokens_is_a_429_and_one_at_the_cap_is_accepted(admin, sandbox_proc):
    url = sandbox_proc[1]
    tokens = tokens_of(url, admin)
    c = client(url, key="g-one")
    admin.set_scenario("normal", quota_enqueued_tokens=2 * tokens - 1, in_progress_s=10.0)
    admin.clock(freeze=True)
    first = create(c)
    with pytest.raises(errors.ClientError) as caught:
        create(c)
    error = caught.value
    assert (error.code, error.status) == (429, "RESOURCE_EXHAUSTED")
    found = re.search(r"Enqueued token limit reached for (\S+)\. Limit: (\d+) enqueued tokens", error.message)
    assert found and found.groups() == (MODEL, str(2 * tokens - 1))
    assert error.details["error"]["details"] == [
        {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "11s"}
    ]  # the first batch ends in 10.1 s
    admin.set_scenario("normal", quota_enqueued_tokens=2 * tokens, in_progress_s=10.0)
    second = create(c)  # exactly the cap
    admin.clock(advance_s=11.0)
    assert {c.batches.get(name=j.name).state.name for j in (first, second)} == {"JOB_STATE_SUCCEEDED"}
    assert {e["batch_id"] for e in admin.ledger()} == {first.name, second.name}
    load = admin.load()
    assert assert_never_over(load, "gemini", "tokens", 2 * tokens) == 2 * tokens
    assert [e["event"] for e in load_events(load, "gemini")] == ["enqueue", "refuse", "enqueue", "release", "release"]
    assert {(e["account"], e["model"]) for e in load["events"]} == {("g-one", MODEL)} and load["refusals"] == 1


def test_the_load_frees_when_a_batch_ends_and_keys_and_models_are_apart(admin, sandbox_proc):
    url = sandbox_proc[1]
    tokens = tokens_of(url, admin)
    one, two = client(url, key="g-one"), client(url, key="g-two")
    admin.set_scenario("normal", quota_enqueued_tokens=tokens, in_progress_s=10.0)
    admin.clock(freeze=True)
    held = create(one)
    create(two)  # another key
    one.batches.create(model="gemini-2.5-pro", src=upload(one, DATA).name)  # another model of the same key
    with pytest.raises(errors.ClientError) as caught:
        create(one)
    assert caught.value.code == 429
    admin.clock(advance_s=11.0)
    assert one.batches.get(name=held.name).state.name == "JOB_STATE_SUCCEEDED"
    later = create(one)
    assert later.state.name == "JOB_STATE_PENDING"
    load = admin.load()
    assert_never_over(load, "gemini", "tokens", tokens)
    keys = {(e["account"], e["model"]) for e in load["events"] if e["event"] == "enqueue"}
    assert keys == {("g-one", MODEL), ("g-two", MODEL), ("g-one", "gemini-2.5-pro")}
    assert [e["batch_id"] for e in load["events"] if e["event"] == "refuse"] == [""]  # no batch was created
