"""Embeddings jobs through Dagster's materialize() on the sandbox: OpenAI batch and online, Gemini batch
(asyncBatchEmbedContent, the real google-genai SDK), the vector gate, one paid request per unique input, and cosine
similarity in the DuckDB file."""

import json
from collections import Counter

import duckdb
import numpy as np
import polars as pl
import pytest

from batch_pipeline.core.ledger.result_parts import read_results
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline.defs.pipeline import run_job

from .conftest import ledger_ids

DIMS = 64
BACKENDS = ["openai_batch", "online", "gemini_batch"]
MODELS = {
    "openai_batch": "text-embedding-3-small",
    "online": "text-embedding-3-small",
    "gemini_batch": "gemini-embedding-001",
}
PRICE_PER_TOKEN = {
    "openai_batch": 0.02 / 1e6 * 0.5,
    "online": 0.02 / 1e6,  # data/prices.yaml
    "gemini_batch": 0.15 / 1e6 * 0.5,
}


def _rows() -> list[dict]:
    bodies = [
        "My invoice was charged twice this month",
        "The app crashes when I open the settings screen",
        "Please add a dark mode to the dashboard",
        "I cannot log in after the password reset",
        "My invoice was charged twice this month",  # a duplicate of the first: paid once
        "Refund the duplicate charge on my invoice",
        "The export button fails with an error",
        "How do I merge two accounts into one",
        "The app crashes when I open the settings screen",
    ]
    return [{"ticket_id": f"T{i}", "subject": "s", "body": b} for i, b in enumerate(bodies)]


def _embedding_job(make_job, backend: str, rows: list[dict] | None = None, **overrides):
    """The demo's spec made an embeddings job: no system prompt, and no sampling (an embeddings job takes none)."""
    return make_job(
        rows=rows or _rows(),
        model=MODELS[backend],
        sampling=None,
        backend={"name": backend, "settings": {"sandbox": True}},
        prompt={"version": "e1", "template": "{body}"},
        output={"embedding": {"dimensions": DIMS}},
        shards={"max_requests": 4},
        canary={"max_failure_rate": 1.0},
        **overrides,
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_embeddings_job_end_to_end(sandbox, instance, resources, home, make_job, backend):
    spec = _embedding_job(make_job, backend)
    report = run_job(spec, instance, resources)
    store = Store(home)
    assert report["complete"] and report["dead_lettered"] == 0
    validated = pl.read_parquet(store.read_bytes(JobPaths(spec.name).validated))
    assert validated.height == len(_rows())
    assert validated.schema["embedding"] == pl.Array(pl.Float32, DIMS)
    vectors = np.array(validated["embedding"].to_list(), dtype=np.float32)
    assert np.isfinite(vectors).all() and np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert all(json.loads(o)["dimensions"] == DIMS for o in validated["output"])
    # one paid request per unique input: the two duplicate bodies are not sent again
    ledger = sandbox.ledger()
    unique = validated["request_id"].n_unique()
    assert unique == len(_rows()) - 2
    if backend == "online":
        keys = Counter(e["request_key"] for e in ledger if e.get("mode") == "online")
        assert len(keys) == unique and max(keys.values()) == 1
    else:
        billed = Counter(ledger_ids(sandbox))
        assert set(billed) == set(validated["request_id"]) and max(billed.values()) == 1
    assert all(e["output_tokens"] == 0 and e["model"] == MODELS[backend] for e in ledger)
    # embedding prices: input only, the batch discount on the batch API
    results = read_results(store, spec.name)
    assert (results["output_tokens"] == 0).all() and (results["input_tokens"] > 0).all()
    assert results["cost_usd"].to_list() == pytest.approx(
        [t * PRICE_PER_TOKEN[backend] for t in results["input_tokens"].to_list()], rel=1e-9
    )
    assert validated["cost_usd"].sum() == pytest.approx(results["cost_usd"].sum(), abs=1e-12)
    quote = json.loads(store.read_bytes(JobPaths(spec.name).quote))
    assert quote["passes"]["first"]["output_tokens_max"] == 0
    # the DuckDB file: the vector column is FLOAT[N] and array_cosine_similarity works on it
    con = duckdb.connect(str(store.local_path(JobPaths(spec.name).duckdb)), read_only=True)
    try:
        assert con.sql("SELECT DISTINCT typeof(embedding) FROM validated").fetchall() == [(f"FLOAT[{DIMS}]",)]
        pairs = con.sql("""
            SELECT a.line AS a, b.line AS b, array_cosine_similarity(a.embedding, b.embedding) AS sim
            FROM validated a JOIN validated b ON a.line < b.line ORDER BY sim DESC""").fetchall()
    finally:
        con.close()
    by_pair = {(a, b): sim for a, b, sim in pairs}
    assert by_pair[(1, 5)] == pytest.approx(1.0, abs=1e-6)  # the same text, the same vector
    # texts that share words point the same way: the two invoice tickets are closer than invoice vs dark mode
    assert by_pair[(1, 6)] > by_pair[(1, 3)]


SHORT = [{"ticket_id": f"S{i}", "subject": "s", "body": f"refund {i} please"} for i in range(40)]


@pytest.mark.parametrize("backend", ["openai_batch", "online"])  # gemini_batch: the test after this one
@pytest.mark.parametrize("rows", ["short", "tickets"])
def test_the_quote_prices_embeddings_at_what_the_sandbox_bills(
    sandbox, instance, resources, home, make_job, backend, rows
):
    """The first quote, made before anything is sent (nothing measured to calibrate on), lands within 3% of what
    the sandbox's ledger bills: the input text alone (cl100k_base, no chat framing: 4 tokens of a 40-row job of
    4-token texts were quoted as 11), no output, at the embedding price (half on the batch API), and its stored
    figure keeps its digits (a $0.0000016 bill was quoted $0.000004: 2.5x)."""
    spec = _embedding_job(make_job, backend, rows=SHORT if rows == "short" else None)
    report = run_job(spec, instance, resources)
    assert report["complete"] and report["dead_lettered"] == 0
    store = Store(home)
    quotes = sorted(store.list_files(f"{JobPaths(spec.name).root}/quotes", suffix=".json"))
    first = store.read_json(quotes[0])
    assert first["calibration"]["items_measured"] == 0 and first["pending_requests"] == report["unique_requests"]
    billed = [e for e in sandbox.ledger() if e["model"] == MODELS[backend]]
    assert len(billed) == report["unique_requests"] and all(e["output_tokens"] == 0 for e in billed)
    tokens = sum(e["input_tokens"] for e in billed)
    usd = tokens * PRICE_PER_TOKEN[backend]
    assert first["passes"]["first"]["input_tokens"] == pytest.approx(tokens, rel=0.03)
    assert first["passes"]["first"]["cost_expected"] == pytest.approx(usd, rel=0.03)
    assert first["est_cost_usd"]["expected"] == pytest.approx(usd, rel=0.03)
    assert first["est_cost_usd"]["low"] <= usd * 1.03 and first["est_cost_usd"]["high"] >= usd
    # what the job recorded is what was billed
    assert float(read_results(store, spec.name)["cost_usd"].sum()) == pytest.approx(usd, rel=1e-6)


@pytest.mark.parametrize("rows", ["short", "tickets"])
def test_the_quote_prices_gemini_embeddings_at_what_the_sandbox_bills(
    sandbox, instance, resources, home, make_job, rows
):
    """Gemini's tokenizer is not published, so the first quote counts ~4 characters a token (within a quarter of
    the bill, a band that holds it on uniform texts) and the canary calibrates it: the job's last quote (what was
    spent on the canary plus the calibrated estimate of the rest) lands within 3% of what the sandbox billed, each
    request once, input only, at gemini-embedding-001's batch price."""
    spec = _embedding_job(make_job, "gemini_batch", rows=SHORT if rows == "short" else None)
    report = run_job(spec, instance, resources)
    assert report["complete"] and report["dead_lettered"] == 0
    store = Store(home)
    billed = [e for e in sandbox.ledger() if e["model"] == MODELS["gemini_batch"]]
    assert sorted(ledger_ids(sandbox)) == sorted(set(ledger_ids(sandbox)))  # each request billed once
    assert len(billed) == report["unique_requests"] and all(e["output_tokens"] == 0 for e in billed)
    usd = sum(e["input_tokens"] for e in billed) * PRICE_PER_TOKEN["gemini_batch"]
    quotes = sorted(store.list_files(f"{JobPaths(spec.name).root}/quotes", suffix=".json"))
    first = store.read_json(quotes[0])
    assert first["calibration"]["items_measured"] == 0 and first["tokenizer"]["exact"] is False
    assert first["passes"]["first"]["output_tokens_max"] == 0
    assert first["est_cost_usd"]["expected"] == pytest.approx(usd, rel=0.25)
    last = json.loads(store.read_bytes(JobPaths(spec.name).quote))
    assert last["calibration"]["items_measured"] > 0
    assert last["spent_usd"] + last["est_cost_usd"]["expected"] == pytest.approx(usd, rel=0.03)
    assert float(read_results(store, spec.name)["cost_usd"].sum()) == pytest.approx(usd, rel=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("marker", "message"),
    [("bad_dimension", f"{DIMS - 1} dimensions"), ("nan_vector", "non-finite"), ("zero_vector", "norm 0")],
)
def test_a_bad_vector_is_invalid_and_retried(sandbox, instance, resources, home, make_job, backend, marker, message):
    """The sandbox answers the marked input wrongly the first time only: the gate rejects the vector, the item
    is retried (``retries.invalid_output``) and the second answer is published."""
    rows = [*_rows()[:4], {"ticket_id": "TX", "subject": "s", "body": f"odd one [[sandbox:{marker}]]"}]
    # one retry of five items is over the default retry-spend cap (10% of the first pass)
    spec = _embedding_job(make_job, backend, rows=rows, retries={"per_item": 3, "spend_cap_share": 1.0})
    report = run_job(spec, instance, resources)
    store = Store(home)
    assert report["complete"] and report["dead_lettered"] == 0 and report["succeeded"] == 5
    results = read_results(store, spec.name)
    validated = pl.read_parquet(store.read_bytes(JobPaths(spec.name).validated))
    odd = validated.filter(pl.col("source_key") == "TX")["request_id"][0]
    tries = results.filter(pl.col("request_id") == odd).sort("attempt")
    assert tries["status"].to_list() == ["invalid", "succeeded"]
    assert tries["error_code"][0] == "contract_violation" and message in tries["error_message"][0]
    assert tries["error_class"][0] == "invalid_output"
    assert validated.filter(pl.col("request_id") == odd)["attempt"][0] == 2
    # the bad answer was paid, and so was the retry; the others were sent once
    assert (results.filter(pl.col("request_id") != odd)["attempt"] == 1).all()
    assert len(sandbox.ledger()) == 6
