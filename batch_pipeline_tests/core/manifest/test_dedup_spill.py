"""The bounded-memory dedup: with a tiny memory bound the build spills to hash ranges (from the start, or past
the bound in mid-build) and gives exactly the shards, items and rows of the in-memory build."""

import random

import pyarrow.parquet as pq
import pytest

from batch_pipeline.core.manifest.dedup import SET_BYTES_PER_ID
from batch_pipeline.core.manifest.shards import Manifest, build_manifest
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline_tests.core.helpers import base_spec_dict, write_jsonl, write_spec

N = 3000


def input_rows(seed: int, start: int, n: int) -> list[dict]:
    """Mixed lengths, with repeats (exact and whitespace variants) of earlier rows, also across files."""
    rng = random.Random(seed)
    out: list[dict] = []
    for i in range(start, start + n):
        if out and rng.random() < 0.15:
            body = rng.choice(out)["body"]
            body = body if rng.random() < 0.5 else "  " + body.replace(" ", "\t", 2) + "\n"
        else:
            body = f"ticket {i} " + "w " * rng.choice((5, 60, 300, 900))
        out.append({"id": f"k{i}", "body": body})
    return out


def build_job(root, budget: int | None, memory_mb: int | None = None):
    """Two generations (three files, then a fourth with repeats of the first), built with ``budget``."""
    data = root / "in"
    write_jsonl(data / "a.jsonl", input_rows(1, 0, N))
    write_jsonl(data / "b.jsonl", input_rows(2, N, N) + input_rows(1, 0, 200))
    shards = {"max_requests": 400, **({"manifest_memory_mb": memory_mb} if memory_mb else {})}
    spec = write_spec(root / "jobs", base_spec_dict(str(data / "*.jsonl"), shards=shards))
    store = Store(root / "store")
    first = build_manifest(spec, store, dedup_budget_bytes=budget)
    write_jsonl(data / "c.jsonl", input_rows(3, 2 * N, 1000) + input_rows(2, N, 300))
    second = build_manifest(spec, store, dedup_budget_bytes=budget)
    return spec, store, first, second


def snapshot(store: Store) -> dict:
    """Every shard's items and every live row, with sources by file name (the jobs live in different dirs)."""
    m = Manifest("t", store)

    def named(r: dict) -> dict:
        return {**r, "source": r["source"].rsplit("/", 1)[1]}

    shards = {
        s: [named(r) for r in pq.read_table(store.local_path(JobPaths("t").shard_items(s))).to_pylist()]
        for s in m.shard_ids()
    }
    rows = sorted(tuple(named(r).values()) for r in m.rows().to_pylist())
    return {"shards": shards, "rows": rows}


@pytest.fixture(scope="module")
def in_memory(tmp_path_factory):
    _, store, first, second = build_job(tmp_path_factory.mktemp("mem"), budget=None)
    assert not first.spilled and not second.spilled
    return snapshot(store), first, second


def summary_counts(s) -> tuple:
    return (
        s.input_rows,
        s.accepted_rows,
        s.new_requests,
        s.unique_requests,
        s.duplicates_collapsed,
        s.known_requests,
        s.new_shards,
        s.shards_total,
    )


@pytest.mark.parametrize("budget", [0, 700 * SET_BYTES_PER_ID], ids=["spill-from-start", "spill-mid-build"])
def test_spilled_build_has_the_same_membership_as_in_memory(tmp_path, in_memory, budget):
    expected, mem_first, mem_second = in_memory
    _, store, first, second = build_job(tmp_path, budget=budget)
    assert first.spilled and second.spilled
    got = snapshot(store)
    assert got["shards"].keys() == expected["shards"].keys()
    for sid, items in expected["shards"].items():
        assert got["shards"][sid] == items, f"shard {sid} differs"
    assert got["rows"] == expected["rows"]
    assert summary_counts(first) == summary_counts(mem_first)
    assert summary_counts(second) == summary_counts(mem_second)
    assert second.known_requests > 0 and second.new_requests > 0  # the second generation met earlier IDs


def test_the_spec_memory_bound_sets_the_spill(tmp_path, in_memory):
    """``shards.manifest_memory_mb`` is the bound when no budget is given: half of 1 MB holds ~2,600 IDs, so the
    second generation (~5,300 earlier IDs) decides by hash range."""
    expected, _, _ = in_memory
    _, store, _, second = build_job(tmp_path, budget=None, memory_mb=1)
    assert second.spilled
    assert snapshot(store) == expected


def test_spill_scratch_is_removed(tmp_path, in_memory):
    import tempfile
    from pathlib import Path

    before = {p.name for p in Path(tempfile.gettempdir()).glob("manifest-*")}
    build_job(tmp_path, budget=0)
    assert {p.name for p in Path(tempfile.gettempdir()).glob("manifest-*")} <= before
