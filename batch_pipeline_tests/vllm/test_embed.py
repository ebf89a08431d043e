"""An embeddings job on real vLLM: ``LLM.embed`` on the tiny Llama run as a pooling model, through materialize()."""

import duckdb
import numpy as np
import polars as pl
import pytest

from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline.defs.pipeline import run_job
from batch_pipeline.models.tiny_llama import TINY

DIMS = TINY["hidden_size"]
ROWS = [
    {"ticket_id": f"T{i}", "subject": "s", "body": body}
    for i, body in enumerate(
        [
            "my invoice was charged twice",
            "the app crashes on start",
            "please add a dark mode",
            "my invoice was charged twice",  # a duplicate: embedded once, answered for both rows
            "i cannot log in after the password reset",
            "the export button fails",
        ]
    )
]


def test_embeddings_job_on_a_pooling_model(make_job, instance, resources, home):
    spec = make_job(
        "vembed",
        rows=ROWS,
        prompt={"version": "e1", "template": "{body}"},
        sampling=None,
        output={"embedding": {"dimensions": DIMS}},
        canary={"max_failure_rate": 0.0},
    )
    report = run_job(spec, instance, resources)
    assert report["complete"] and report["succeeded"] == report["unique_requests"] == len(ROWS) - 1
    assert report["invalid"] == report["dead_lettered"] == 0
    store = Store(home)
    table = pl.read_parquet(store.local_path(JobPaths("vembed").validated))
    assert table.height == len(ROWS) and table.schema["embedding"] == pl.Array(pl.Float32, DIMS)
    vectors = np.array(table["embedding"].to_list(), dtype=np.float32)
    assert np.isfinite(vectors).all() and np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    assert len({v.tobytes() for v in vectors}) == len(ROWS) - 1  # different texts, different vectors
    assert (table["input_tokens"] > 0).all() and (table["output_tokens"] == 0).all()
    con = duckdb.connect(str(store.local_path(JobPaths("vembed").duckdb)), read_only=True)
    try:
        same = con.sql(
            "SELECT array_cosine_similarity(a.embedding, b.embedding) FROM validated a, validated b "
            "WHERE a.line = 1 AND b.line = 4"
        ).fetchall()
    finally:
        con.close()
    assert len(same) == 1 and same[0][0] == pytest.approx(1.0, abs=1e-5)


def test_a_dimension_other_than_the_hidden_size_is_refused_before_anything_runs(make_job, instance, resources):
    import dagster as dg

    spec = make_job(
        "vembedbad",
        rows=ROWS[:2],
        prompt={"version": "e1", "template": "{body}"},
        sampling=None,
        output={"embedding": {"dimensions": DIMS + 1}},
    )
    with pytest.raises(dg.Failure, match="hidden size"):
        run_job(spec, instance, resources)
