"""Publishing built streaming: the validated table by DuckDB over the parts, the report's figures and the dead
letters by one pass a group of shards at a time. Each is checked against the whole-frame formulation computed
here from every row (the oracle), on a job with duplicates, retries, dead letters and several shards."""

import gc
import json

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batch_pipeline.core.errors import ReconciliationError
from batch_pipeline.core.ledger.executor import RequestPlan, ShardWork, raw_table
from batch_pipeline.core.ledger.reconcile import DEAD, counts_by_shard
from batch_pipeline.core.ledger.result_parts import write_results
from batch_pipeline.core.manifest.read import VALIDATED_COLUMNS
from batch_pipeline.core.manifest.shards import Manifest, build_manifest
from batch_pipeline.core.publish import validated
from batch_pipeline.core.publish.report import build_report, shard_table
from batch_pipeline.core.publish.scan import scan_job
from batch_pipeline.core.publish.tables import JobState, dead_letters, promote, stage
from batch_pipeline.core.publish.validated import write_validated
from batch_pipeline.core.run.results import build_results
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline_tests.core.helpers import base_spec_dict, write_jsonl, write_spec


def _answer(rid: str, label: str | None, status: int = 200, code: str | None = None) -> tuple:
    text = json.dumps({"label": label}) if label else None
    return (
        rid,
        status,
        text,
        "stop" if status == 200 else None,
        100,
        10,
        3,
        code,
        None,
        f"req_{rid}",
        json.dumps({"custom_id": rid}),
    )


@pytest.fixture
def job(tmp_path):
    """40 rows (every fifth repeats an earlier body: one request, several rows) in shards of 7 requests. Attempt 1:
    most succeed, some 500 and some 400 (poison); attempt 2 answers the 500s and some already answered; one item is
    never answered."""
    bodies = [f"ticket {i}" if i % 5 else f"ticket {i - 5 if i >= 5 else 0}" for i in range(40)]
    rows = [{"id": f"k{i}", "body": b} for i, b in enumerate(bodies)]
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    spec = write_spec(tmp_path / "job", base_spec_dict(str(path), shards={"max_requests": 7}, retries={"per_item": 2}))
    store = Store(tmp_path / "store")
    summary = build_manifest(spec, store)
    assert len(summary.new_shards) > 3
    plan = RequestPlan.from_spec(spec)
    manifest = Manifest(spec.name, store)
    for n, sid in enumerate(manifest.shard_ids()):
        ids = manifest.shard_items(sid, ["request_id"]).column("request_id").to_pylist()
        first = [_answer(r, "bug") if i % 4 else _answer(r, None, 500, "server_error") for i, r in enumerate(ids)]
        first[1] = _answer(ids[1], None, 400, "context_length_exceeded")  # poison: dead at once
        first = first[:-1] if n == 0 else first  # shard 1's last item is never answered: missing
        second = [_answer(r, "other") for i, r in enumerate(ids) if i % 4 == 0]
        second += [_answer(r, "billing") for i, r in enumerate(ids[:-1]) if i % 4 == 2]  # answered twice: latest wins
        for attempt, lines in ((1, first), (2, second)):
            table = _store_answers(spec, store, plan, sid, attempt, lines)
            if attempt == 1 and n == 1:
                write_results(store, spec.name, sid, attempt, 1, table)  # re-collected: the same rows again
    return spec, store


def _store_answers(spec, store, plan: RequestPlan, sid: str, attempt: int, lines: list[tuple]) -> pa.Table:
    """One result part of ``lines`` for the shard's attempt, as the runner stores a collected batch."""
    work = ShardWork(
        spec.name, sid, attempt, f"{spec.name}:{sid}:{attempt}", plan, raw_table(lines).select(["request_id"])
    )
    table = build_results(
        raw_table(lines),
        work,
        backend="openai_batch",
        pricing="batch",
        prompt_version="v1",
        price=None,
        provider_batch_id=f"b-{sid}-{attempt}",
    )
    write_results(store, spec.name, sid, attempt, 1, table)
    return table


def _oracle_table(spec, store) -> pl.DataFrame:
    """The whole-frame formulation: every source row joined to its request's latest valid result."""
    state = JobState.load(spec, store)
    rows = pl.from_arrow(Manifest(spec.name, store).rows())
    valid = state.results.filter(pl.col("status") == "succeeded").sort("attempt").unique("request_id", keep="last")
    table = rows.join(valid.rename({"parsed_output": "output"}), on="request_id", how="inner").sort("source", "line")
    table = table.with_columns(pl.col("request_id").is_first_distinct().not_().alias("is_duplicate"))
    table = table.with_columns(
        pl.when(pl.col("is_duplicate")).then(0.0).otherwise(pl.col("cost_usd")).alias("cost_usd")
    )
    return table.select(VALIDATED_COLUMNS)


def test_the_streamed_validated_table_is_the_whole_frame_table(job):
    spec, store = job
    rel = JobPaths(spec.name).staged
    n = write_validated(spec, store, rel, memory_limit="64MB")
    got = pl.read_parquet(store.local_path(rel))
    want = _oracle_table(spec, store)
    assert n == got.height == want.height and 25 < n < 40  # the dead and the missing items' rows are not in it
    assert got.columns == VALIDATED_COLUMNS
    assert got.equals(want.cast(dict(got.schema)))
    assert got["is_duplicate"].sum() > 0 and got.filter(pl.col("is_duplicate"))["cost_usd"].sum() == 0
    # attempt 2 answered what attempt 1 failed, and again some it had answered: its labels are the ones published
    assert set(got.filter(pl.col("attempt") == 2)["output"]) == {"other", "billing"}


def _full_collections(run) -> int:
    """How many full (generation 2) garbage collections ``run()`` made itself: automatic ones are off meanwhile."""
    seen: list[int] = []

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 2:
            seen.append(1)

    was_enabled = gc.isenabled()
    gc.disable()
    gc.callbacks.append(on_gc)
    try:
        run()
    finally:
        gc.callbacks.remove(on_gc)
        if was_enabled:
            gc.enable()
    return len(seen)


def test_garbage_is_collected_before_the_query_only_for_results_worth_it(job):
    """A full collection costs 0.1-0.5 s in a process holding many definitions; on a few kilobytes of results it
    hands back nothing worth that, at 1M items hundreds of MiB (``test_validated_memory``)."""
    spec, store = job
    rel = JobPaths(spec.name).staged
    results = sum(size for _, size, _ in store.file_stats(JobPaths(spec.name).results))
    assert 0 < results < validated.COLLECT_FROM_BYTES
    assert _full_collections(lambda: write_validated(spec, store, rel)) == 0
    assert _full_collections(lambda: write_validated(spec, store, rel, collect_from_bytes=results)) == 1
    assert _full_collections(lambda: write_validated(spec, store, rel, collect_from_bytes=results + 1)) == 0


def test_out_of_duckdb_memory_the_table_is_built_again_with_the_fallback(job, caplog):
    spec, store = job
    paths = JobPaths(spec.name)
    with pytest.raises(duckdb.OutOfMemoryException):  # the limit bites on this job
        validated._write_validated(spec, store, paths.staged, "1MB")
    n = write_validated(spec, store, paths.staged, memory_limit="1MB")
    assert n == _oracle_table(spec, store).height
    assert "out of DuckDB's 1MB" in caplog.text and validated.FALLBACK_MEMORY_LIMIT in caplog.text


def test_a_torn_result_part_is_left_out_of_the_table_not_fatal(job, caplog):
    spec, store = job
    paths = JobPaths(spec.name)
    store.write_bytes(paths.result_part("s00001", 3, 1, "torn0000"), b"PAR1 torn")
    n = write_validated(spec, store, paths.staged)
    assert n == _oracle_table(spec, store).height
    assert any("torn" in r.getMessage() for r in caplog.records)


def test_the_scan_in_small_groups_gives_the_whole_frame_figures(job):
    spec, store = job
    state = JobState.load(spec, store)
    scan = scan_job(spec, store, group_items=5)  # one or two shards per group
    assert scan.groups >= 4
    assert scan.per_shard == counts_by_shard(state.states)
    res = state.results
    assert scan.requests_sent == res.height
    assert scan.input_tokens == res["input_tokens"].sum() and scan.output_tokens == res["output_tokens"].sum()
    assert scan.cost_usd == pytest.approx(res["cost_usd"].sum())
    firsts = res.filter(pl.col("attempt") == pl.col("attempt").min().over("request_id"))
    assert scan.first_try_cost_usd == pytest.approx(firsts["cost_usd"].sum())
    want_dead = state.states.filter(pl.col("state") == DEAD).select(scan.dead_letters.columns).sort("request_id")
    assert scan.dead_letters.sort("request_id").equals(want_dead.cast(dict(scan.dead_letters.schema)))
    assert scan.dead_letters.height >= 5
    assert scan.timeline["accepted"].sum() == res.filter(pl.col("status") == "succeeded").height
    totals = scan.check()
    assert totals.expected == state.items.height and totals.balanced and totals.missing == 1


def test_the_scan_keeps_no_group_of_results_alive_through_its_dead_letters(job):
    """A filtered frame's strings point into the buffers they were read into (pyarrow's, zero-copy): dead letters
    kept as filtered would hold every group's results until the scan is dropped (652 MB after 10M items)."""
    spec, store = job
    gc.collect()
    before = pa.total_allocated_bytes()
    scan = scan_job(spec, store, group_items=5)
    gc.collect()
    assert scan.dead_letters.height >= 5
    assert pa.total_allocated_bytes() - before == 0


def test_stage_report_and_promote_read_no_whole_frame(job):
    spec, store = job
    state = JobState.load(spec, store)
    outputs = stage(spec, store, state)
    assert outputs["staged"].endswith(JobPaths(spec.name).staged)
    report = build_report(spec, store, state, outputs={})
    assert "_frames" not in state.__dict__  # items, results and states were never read whole
    assert report["succeeded"] == state.scan.totals.valid and report["missing"] == 1
    assert report["requests_sent"] == state.scan.requests_sent
    assert [r["shard"] for r in shard_table(state)] == Manifest(spec.name, store).shard_ids()
    assert (
        pq.read_metadata(store.local_path(JobPaths(spec.name).staged_dead_letters)).num_rows
        == dead_letters(state).height
    )
    promoted = promote(spec, store)
    paths = JobPaths(spec.name)
    assert store.read_bytes(paths.validated) == store.read_bytes(paths.staged) and "duckdb" in promoted
    import duckdb

    con = duckdb.connect(promoted["duckdb"], read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM payloads").fetchone()[0] == state.scan.requests_sent + 7
        assert (
            con.execute("SELECT count(*) FROM validated").fetchone()[0]
            == report["accepted_rows"]
            - con.execute(
                "SELECT count(*) FROM source_rows WHERE request_id NOT IN (SELECT request_id FROM validated)"
            ).fetchone()[0]
        )
    finally:
        con.close()


def test_results_under_a_shard_the_manifest_lacks_fail_the_check(job):
    spec, store = job
    stray = raw_table([_answer("not-an-item", "bug")])
    work = ShardWork(spec.name, "s09999", 1, "k", RequestPlan.from_spec(spec), stray.select(["request_id"]))
    write_results(
        store,
        spec.name,
        "s09999",
        1,
        1,
        build_results(
            stray, work, backend="openai_batch", pricing="batch", prompt_version="v1", price=None, provider_batch_id="b"
        ),
    )
    with pytest.raises(ReconciliationError, match="does not know"):
        JobState.load(spec, store).check()


def test_the_steps_of_a_publish_share_one_scan_until_what_it_read_changes(job):
    """``JobState.scan`` is one pass per set of inputs in a process (``scan.scanned``): the publish's four steps
    asked for the same pass one after another. A new result part, a rewritten file and another spec each make a
    new pass, which sees the change."""
    spec, store = job
    first = JobState.load(spec, store).scan
    assert JobState.load(spec, store).scan is first  # another step of the same publish: no second pass
    # a result part written since: a new pass, with its rows
    ids = Manifest(spec.name, store).shard_items("s00002", ["request_id"]).column("request_id").to_pylist()
    _store_answers(spec, store, RequestPlan.from_spec(spec), "s00002", 3, [_answer(ids[0], "feature")])
    after_part = JobState.load(spec, store).scan
    assert after_part is not first and after_part.requests_sent == first.requests_sent + 1
    # a file rewritten under the same name (the manifest's shard file, torn): the pass reads it again and fails
    shard = JobPaths(spec.name).shard_items("s00003")
    good = store.read_bytes(shard)
    store.write_bytes(shard, b"PAR1 torn")
    with pytest.raises(FileNotFoundError, match="no readable items for shard s00003"):
        JobState.load(spec, store).scan  # noqa: B018
    store.write_bytes(shard, good)
    # another spec (a different retry budget) over the same files: a new pass
    other = spec.model_copy(update={"retries": spec.retries.model_copy(update={"per_item": 5})})
    assert JobState.load(other, store).scan is not JobState.load(spec, store).scan
