"""Vertex AI's concurrent-jobs quota through the real google-genai SDK (vertexai=True) and a loopback GCS emulator:
a create past ``quota_concurrent_jobs`` (jobs not ended, per project and region) is a 429 RESOURCE_EXHAUSTED naming
the limit, exactly past the cap and not at it; another project has its own; an ended job frees its slot."""

from __future__ import annotations

import re

import pytest
from google.genai import errors as genai_errors

from ..support import assert_never_over, load_events
from .test_vertex import BUCKET, REQUEST, client, gcs, put_input, wait  # noqa: F401 (gcs: a fixture)

CONFIG = {"dest": f"gs://{BUCKET}/q/out"}


def create(c, src: str):
    return c.batches.create(model="gemini-2.5-flash", src=src, config=CONFIG)


def test_concurrent_jobs_past_the_cap_are_a_429_per_project_and_freed_by_an_ended_job(vertex_sandbox, gcs):
    url = vertex_sandbox.base_url
    src = put_input(gcs, "q/input.jsonl", [REQUEST, REQUEST])
    mine, theirs = client(url, project="proj-a"), client(url, project="proj-b")
    vertex_sandbox.set_scenario("normal", quota_concurrent_jobs=2, in_progress_s=10.0)
    vertex_sandbox.clock(freeze=True)
    jobs = [create(mine, src), create(mine, src)]  # exactly the cap
    with pytest.raises(genai_errors.APIError) as caught:
        create(mine, src)
    assert (caught.value.code, caught.value.status) == (429, "RESOURCE_EXHAUSTED")
    assert re.search(r"Limit: 2 concurrent batch prediction jobs per project and region", caught.value.message)
    other = create(theirs, src)  # another project: its own quota
    assert other.state.name == "JOB_STATE_PENDING"
    vertex_sandbox.clock(advance_s=11.0)
    assert {wait(mine, j.name).state.name for j in jobs} == {"JOB_STATE_SUCCEEDED"}
    later = create(mine, src)
    assert later.state.name == "JOB_STATE_PENDING"
    assert wait(theirs, other.name).state.name == "JOB_STATE_SUCCEEDED"
    billed = [e["batch_id"] for e in vertex_sandbox.ledger()]  # the refused create billed nothing
    assert sorted(billed) == sorted([j.name for j in jobs for _ in range(2)] + [other.name] * 2)
    load = vertex_sandbox.load()
    assert assert_never_over(load, "vertex", "jobs", 2) == 2 and load["refusals"] == 1
    ours = [e for e in load_events(load, "vertex") if e["account"] == "proj-a"]
    assert [e["event"] for e in ours] == ["enqueue", "enqueue", "refuse", "release", "release", "enqueue"]
    assert {e["model"] for e in ours} == {"gemini-2.5-flash"} and ours[0]["requests"] == 2
