"""Gemini batch embeddings (``models/M:asyncBatchEmbedContent``) through the real google-genai SDK's
``batches.create_embeddings`` against a sandbox process: a file batch answers one line per input line with a
vector of exactly ``outputDimensionality`` values (unit, the same for the same text), billed once as input only;
an inline batch comes back as the SDK's ``inlined_embed_content_responses``; the batch routes serve it as any."""

import json
import warnings

import numpy as np
import pytest
from google.genai import errors, types

from .test_gemini_api import client, result_lines, upload
from .test_gemini_inline import raw, wait

MODEL = "gemini-embedding-001"
TEXTS = [
    "My invoice was charged twice",
    "The app crashes on start",
    "My invoice was charged twice",
    "[[sandbox:poison]] too long",
    "Please add a dark mode",
]


def lines(texts: list[str], dims: int | None = 64) -> bytes:
    """An embeddings input file: ``{"key", "request": EmbedContentRequest}`` per line."""
    extra = {"outputDimensionality": dims} if dims is not None else {}
    return b"".join(
        json.dumps({"key": f"k{i}", "request": {"content": {"parts": [{"text": t}]}, **extra}}).encode() + b"\n"
        for i, t in enumerate(texts)
    )


def create(c, src, name: str = "emb:s1:1") -> types.BatchJob:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", errors.ExperimentalWarning)
        return c.batches.create_embeddings(model=MODEL, src=src, config={"display_name": name})


def test_a_file_batch_of_embeddings_through_the_sdk(admin, sandbox_proc):
    url = sandbox_proc[1]
    c = client(url)
    f = upload(c, lines(TEXTS))
    admin.clock(freeze=True)
    job = create(c, {"file_name": f.name})
    assert job.state == types.JobState.JOB_STATE_PENDING and job.display_name == "emb:s1:1"
    assert job.model == f"models/{MODEL}"
    pending = raw(url, job.name)
    assert pending["metadata"]["@type"].endswith(".EmbedContentBatch")
    assert pending["metadata"]["inputConfig"] == {"fileName": f.name}
    assert pending["metadata"]["batchStats"] == {"requestCount": "5", "pendingRequestCount": "5"}
    admin.clock(advance_s=1.0)
    job = wait(c, job)
    assert job.state == types.JobState.JOB_STATE_SUCCEEDED and job.dest.file_name
    out = result_lines(c, job)
    assert sorted(line["key"] for line in out) == [f"k{i}" for i in range(len(TEXTS))]  # one per input line
    by = {line["key"]: line for line in out}
    assert set(by["k3"]) == {"key", "error"} and by["k3"]["error"]["code"] == 3  # INVALID_ARGUMENT
    vectors = {}
    for key, line in by.items():
        if key == "k3":
            continue
        parsed = types.SingleEmbedContentResponse.model_validate(line["response"])
        vectors[key] = np.array(parsed.embedding.values, dtype=np.float32)
        assert vectors[key].shape == (64,) and np.linalg.norm(vectors[key]) == pytest.approx(1.0, abs=1e-5)
        assert parsed.token_count > 0
    assert np.array_equal(vectors["k0"], vectors["k2"])  # the same text, the same vector
    assert float(vectors["k0"] @ vectors["k4"]) < 0.99
    # billed once, input only, each answered request at its tokenCount
    ledger = [e for e in admin.ledger() if e["batch_id"] == job.name]
    assert sorted(e["custom_id"] for e in ledger) == ["k0", "k1", "k2", "k4"]
    assert all(e["output_tokens"] == 0 and e["model"] == MODEL and e["provider"] == "gemini" for e in ledger)
    assert {e["custom_id"]: e["input_tokens"] for e in ledger} == {
        k: int(by[k]["response"]["tokenCount"]) for k in ("k0", "k1", "k2", "k4")
    }
    c.batches.get(name=job.name)
    assert len([e for e in admin.ledger() if e["batch_id"] == job.name]) == 4  # reading again bills nothing
    done = raw(url, job.name)
    assert done["response"]["@type"].endswith(".EmbedContentBatchOutput")
    assert done["metadata"]["batchStats"] == {
        "requestCount": "5",
        "successfulRequestCount": "4",
        "failedRequestCount": "1",
    }
    # the existing routes serve it: list, delete
    (listed,) = list(c.batches.list())
    assert listed.name == job.name and listed.display_name == "emb:s1:1"
    c.batches.delete(name=job.name)
    with pytest.raises(errors.ClientError):
        c.batches.get(name=job.name)


def test_the_dimensions_default_to_the_models_and_a_bad_one_fails_the_batch(admin, sandbox_proc):
    c = client(sandbox_proc[1])
    job = wait(c, create(c, {"file_name": upload(c, lines(TEXTS[:1], dims=None)).name}))
    (line,) = result_lines(c, job)
    assert len(line["response"]["embedding"]["values"]) == 3072
    job = wait(c, create(c, {"file_name": upload(c, lines(TEXTS[:1], dims=5000)).name}))
    assert job.state == types.JobState.JOB_STATE_FAILED and admin.ledger()[-1]["custom_id"] == "k0"
    assert len(admin.ledger()) == 1  # the failed batch billed nothing


def test_inline_embeddings_come_back_in_the_operation(admin, sandbox_proc):
    c = client(sandbox_proc[1])
    job = wait(
        c,
        create(
            c,
            {
                "inlined_requests": {
                    "contents": ["refund please", "the app crashes"],
                    "config": {"output_dimensionality": 16},
                }
            },
        ),
    )
    assert job.state == types.JobState.JOB_STATE_SUCCEEDED and job.dest.file_name is None
    answers = job.dest.inlined_embed_content_responses
    assert len(answers) == 2
    assert all(len(a.response.embedding.values) == 16 and a.response.token_count > 0 for a in answers)
    assert answers[0].error is None
    assert len(admin.ledger()) == 2


def test_a_cancel_and_a_cancel_after_the_end(admin, sandbox_proc):
    c = client(sandbox_proc[1])
    admin.set_scenario("slow", in_progress_s=3600)
    job = create(c, {"file_name": upload(c, lines(TEXTS)).name})
    c.batches.cancel(name=job.name)
    admin.clock(advance_s=120)
    job = wait(c, job)
    assert job.state == types.JobState.JOB_STATE_CANCELLED
    with pytest.raises(errors.ClientError):
        c.batches.cancel(name=job.name)
