"""Provider-side data hygiene (core/run/hygiene.py) through the shard runner, with the real OpenAI executor and
SDK against the sandbox process: a collected attempt's files are deleted and ``discarded`` recorded, the attempt
stays collected and closed; ``keep`` deletes and records nothing; a delete that fails leaves the collection
intact and the sweep finishes it; nothing is deleted before the results are stored."""

import logging
from datetime import date

import pytest

from batch_pipeline.core.ledger.attempts import AttemptLog
from batch_pipeline.core.ledger.executor import BatchHandle
from batch_pipeline.core.ledger.machine import IllegalTransition, ShardState, check_attempt_event, last_event
from batch_pipeline.core.manifest.shards import build_manifest
from batch_pipeline.core.pricing.cost import Price
from batch_pipeline.core.run.hygiene import DISCARDED, discard_collected, leftovers, sweep_leftovers
from batch_pipeline.core.run.runner import ShardRunner
from batch_pipeline.core.run.summary import ShardSummaries
from batch_pipeline.core.spec.job import BackendSpec
from batch_pipeline.core.store import Store
from batch_pipeline.executors.registry import create_executor
from batch_pipeline_tests.core.helpers import base_spec_dict, write_jsonl, write_spec

PRICE = Price(input_per_mtok=1.0, output_per_mtok=2.0, batch_discount=0.5, checked=date(2026, 1, 1))
SHARD = "s00001"


def openai(**settings):
    return create_executor(BackendSpec(name="openai_batch", settings={"sandbox": True, **settings}))


@pytest.fixture
def job(tmp_path):
    rows = [{"id": f"k{i}", "body": f"ticket {i}: my invoice was wrong"} for i in range(8)]
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    spec = write_spec(
        tmp_path / "job",
        base_spec_dict(
            str(path),
            model="gpt-4o-mini",
            sampling={"temperature": 0, "max_tokens": 16},
            backend={"name": "openai_batch", "settings": {"sandbox": True}},
        ),
    )
    store = Store(tmp_path / "store")
    assert build_manifest(spec, store).new_shards == [SHARD]
    return spec, store


def file_ids(executor) -> set[str]:
    return {f.id for f in executor.client.files.list()}


def batch_files(executor, batch_id: str) -> set[str]:
    batch = executor.client.batches.retrieve(batch_id)
    return {f for f in (batch.input_file_id, batch.output_file_id, batch.error_file_id) if f}


def run_shard(spec, store, executor):
    runner = ShardRunner(spec, store, executor, PRICE)
    sent = runner.submit(SHARD)
    out = runner.collect(SHARD, poll_interval_s=0.05, timeout_s=60)
    assert out.attempts == [1] and out.succeeded == 8
    return sent.handle


def test_a_collected_attempt_has_its_files_deleted_and_stays_collected_and_closed(admin, job):
    spec, store = job
    ex = openai()
    handle = run_shard(spec, store, ex)
    (attempt,) = AttemptLog(store, spec.name, SHARD).all()
    assert set(attempt.records) == {"intent", "submitted", "collected", DISCARDED}
    ours = batch_files(ex, handle.batch_id)
    assert len(ours) == 2 and set(attempt.discarded.deleted) == ours  # input and output
    assert file_ids(ex) == set()  # the sandbox holds none of the job's files
    assert attempt.closed and not attempt.open and attempt.submitted is not None
    assert last_event(attempt.records) == DISCARDED
    with pytest.raises(IllegalTransition):
        check_attempt_event(SHARD, 1, DISCARDED, "collected")
    summary = ShardSummaries(spec, store).compute(SHARD)
    assert summary.state == ShardState.SETTLED and summary.valid == 8 and summary.last_final_state == "completed"
    assert list(leftovers(spec, store)) == []


def test_keep_deletes_and_records_nothing_and_a_later_delete_sweeps_the_files(admin, job):
    spec, store = job
    keeper = openai(retention="keep")
    handle = run_shard(spec, store, keeper)
    ours = batch_files(keeper, handle.batch_id)
    assert ours <= file_ids(keeper) and len(ours) == 2
    (attempt,) = AttemptLog(store, spec.name, SHARD).all()
    assert DISCARDED not in attempt.records and [a.number for _, a in leftovers(spec, store)] == [1]
    kept = sweep_leftovers(spec, store, lambda name: keeper)
    assert (kept.discarded, kept.kept, kept.failed) == (0, 1, []) and ours <= file_ids(keeper)
    swept = sweep_leftovers(spec, store, lambda name: openai() if name == "openai_batch" else None)
    assert swept.discarded == 1 and set(swept.deleted) == ours and not ours & file_ids(keeper)
    assert AttemptLog(store, spec.name, SHARD).all()[0].discarded.deleted == swept.deleted


def test_a_failing_delete_leaves_the_collection_whole_and_the_sweep_deletes_later(admin, job, caplog):
    spec, store = job
    ex = openai(max_retries=0)
    admin.set_scenario("server_error", times=100, on=["delete_file"])
    with caplog.at_level(logging.WARNING, logger="batch_pipeline.core.run.hygiene"):
        handle = run_shard(spec, store, ex)  # collected in full: the delete failure is not the collection's
    assert any("could not delete" in r.getMessage() and "sweep" in r.getMessage() for r in caplog.records)
    (attempt,) = AttemptLog(store, spec.name, SHARD).all()
    assert "collected" in attempt.records and DISCARDED not in attempt.records
    ours = batch_files(ex, handle.batch_id)
    assert ours <= file_ids(ex)
    failed = sweep_leftovers(spec, store, lambda name: ex)  # still failing: reported, nothing raised
    assert failed.discarded == 0 and len(failed.failed) == 1 and ours <= file_ids(ex)
    admin.set_scenario("normal")
    swept = sweep_leftovers(spec, store, lambda name: ex)
    assert swept.discarded == 1 and file_ids(ex) == set()
    assert sweep_leftovers(spec, store, lambda name: ex).discarded == 0  # nothing left to sweep


def test_nothing_is_deleted_before_the_results_are_stored(admin, job):
    spec, store = job
    ex = openai()
    sent = ShardRunner(spec, store, ex, PRICE).submit(SHARD)
    assert discard_collected(store, spec.name, SHARD, 1, sent.handle, ex) is None  # submitted, not collected
    assert list(leftovers(spec, store)) == [] and sweep_leftovers(spec, store, lambda name: ex).discarded == 0
    assert sent.handle.input_file_id in file_ids(ex)
    with pytest.raises(IllegalTransition):
        AttemptLog(store, spec.name, SHARD).record_once(1, DISCARDED, {"deleted": []})


def test_discarded_is_recorded_once_when_two_runs_race(admin, job):
    spec, store = job
    handle = run_shard(spec, store, openai(retention="keep"))
    log_ = AttemptLog(store, spec.name, SHARD)
    assert log_.record_once(1, DISCARDED, {"deleted": ["a"]}) is True
    assert log_.record_once(1, DISCARDED, {"deleted": ["b"]}) is False
    assert log_.all()[0].discarded.deleted == ["a"]
    again = discard_collected(store, spec.name, SHARD, 1, BatchHandle.from_dict(handle.as_dict()), openai())
    assert again is None  # already discarded: no second delete
