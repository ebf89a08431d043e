"""``/v1/embeddings`` in the sandbox with the real openai SDK: online and as batch lines; deterministic vectors of
the asked dimension, the fault markers on a first sighting only, validation, the ledger."""

from __future__ import annotations

import base64
import json

import numpy as np
import openai
import pytest

from batch_pipeline.sandbox import SandboxAdmin

from ..support import read_jsonl, upload, wait_for

MODEL = "text-embedding-3-small"


def _vector(value) -> np.ndarray:
    return np.frombuffer(base64.b64decode(value), "<f4") if isinstance(value, str) else np.asarray(value, np.float32)


def test_online_vectors_are_deterministic_unit_and_of_the_asked_dimension(client: openai.OpenAI, admin: SandboxAdmin):
    floats = client.embeddings.create(
        model=MODEL, input="my invoice was charged twice", dimensions=32, encoding_format="float"
    )
    raw = client.embeddings.with_raw_response.create(
        model=MODEL, input="my invoice was charged twice", dimensions=32, encoding_format="base64"
    )
    packed = json.loads(raw.text)["data"][0]["embedding"]
    a, b = np.asarray(floats.data[0].embedding, np.float32), _vector(packed)
    assert a.shape == (32,) and np.allclose(a, b) and np.linalg.norm(a) == pytest.approx(1.0, abs=1e-5)
    other = np.asarray(
        client.embeddings.create(model=MODEL, input="dark mode please", dimensions=32, encoding_format="float")
        .data[0]
        .embedding
    )
    assert not np.allclose(a, other)
    assert floats.usage.prompt_tokens > 0
    ledger = admin.ledger()
    assert (
        len(ledger) == 3 and {e["output_tokens"] for e in ledger} == {0} and {e["mode"] for e in ledger} == {"online"}
    )


@pytest.mark.parametrize(
    ("marker", "check"),
    [
        ("bad_dimension", lambda v: v.shape == (15,)),
        ("nan_vector", lambda v: np.isnan(v).any()),
        ("zero_vector", lambda v: not v.any()),
    ],
)
def test_a_fault_marker_spoils_the_first_answer_only(client: openai.OpenAI, admin: SandboxAdmin, marker, check):
    def ask() -> np.ndarray:
        raw = client.embeddings.with_raw_response.create(
            model=MODEL, input=f"text [[sandbox:{marker}]]", dimensions=16, encoding_format="base64"
        )
        return _vector(json.loads(raw.text)["data"][0]["embedding"])

    first, second = ask(), ask()
    assert check(first) and second.shape == (16,) and np.isfinite(second).all() and second.any()


def test_bad_requests_are_refused(client: openai.OpenAI, admin: SandboxAdmin):
    with pytest.raises(openai.BadRequestError, match="dimensions"):
        client.embeddings.create(model=MODEL, input="x", dimensions=5000)
    with pytest.raises(openai.BadRequestError, match="input"):
        client.embeddings.create(model=MODEL, input="")
    with pytest.raises(openai.BadRequestError, match="poison"):
        client.embeddings.create(model=MODEL, input="x [[sandbox:poison]]")
    assert admin.ledger() == []


def _line(custom_id: str, text: str, **body) -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/embeddings",
        "body": {"model": MODEL, "input": text, "dimensions": 8, "encoding_format": "base64", **body},
    }


def test_an_embeddings_batch_answers_every_line_and_bills_each_once(client: openai.OpenAI, admin: SandboxAdmin):
    lines = [
        _line("a", "my invoice"),
        _line("b", "my invoice"),
        _line("c", "x [[sandbox:poison]]"),
        _line("d", "odd [[sandbox:nan_vector]]"),
    ]
    file_id = upload(client, lines)
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings", completion_window="24h")
    done = wait_for(client, batch.id)
    assert done["status"] == "completed" and done["endpoint"] == "/v1/embeddings"
    out = {line["custom_id"]: line for line in read_jsonl(client, done["output_file_id"])}
    errors = {line["custom_id"]: line for line in read_jsonl(client, done["error_file_id"])}
    assert set(out) == {"a", "b", "d"} and set(errors) == {"c"}
    va, vb, vd = (_vector(out[k]["response"]["body"]["data"][0]["embedding"]) for k in "abd")
    assert va.shape == (8,) and np.array_equal(va, vb) and np.isnan(vd).any()
    assert errors["c"]["response"]["status_code"] == 400
    assert sorted(e["custom_id"] for e in admin.ledger()) == ["a", "b", "d"]


def test_an_embeddings_line_without_input_fails_validation(client: openai.OpenAI, admin: SandboxAdmin):
    bad = _line("a", "x")
    del bad["body"]["input"]
    file_id = upload(client, [bad])
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings", completion_window="24h")
    done = wait_for(client, batch.id)
    assert done["status"] == "failed" and done["errors"]["data"][0]["param"] == "body.input"
