"""``noop.inputs_unchanged``: the manifest would read nothing only while every input file is as the latest generation
left it and none is gone; ``current.PublishBasis`` moves with the spec and the record files, not with a manifest run
that read nothing."""

import os

from batch_pipeline.core.manifest.shards import build_manifest
from batch_pipeline.core.publish.current import PublishBasis
from batch_pipeline.core.publish.noop import inputs_unchanged, nothing_to_do
from batch_pipeline.core.run.summary import ShardSummaries
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline_tests.core.helpers import base_spec_dict, write_jsonl, write_spec


def _rows(start: int, n: int) -> list[dict]:
    return [{"id": f"k{i:05d}", "body": f"ticket {i}: " + "word " * (i % 40)} for i in range(start, start + n)]


def _job(tmp_path, **overrides):
    write_jsonl(tmp_path / "in" / "a.jsonl", _rows(0, 60))
    write_jsonl(tmp_path / "in" / "b.jsonl", _rows(1000, 40))
    raw = base_spec_dict(str(tmp_path / "in" / "*.jsonl"), shards={"max_requests": 50}, **overrides)
    spec = write_spec(tmp_path / "jobs", raw)
    store = Store(tmp_path / "store")
    build_manifest(spec, store)
    return spec, store


def test_an_unchanged_input_reads_nothing_and_any_change_reads(tmp_path):
    spec, store = _job(tmp_path)
    assert inputs_unchanged(spec, store)
    build_manifest(spec, store)  # a generation that read nothing: still unchanged
    assert inputs_unchanged(spec, store)
    a = tmp_path / "in" / "a.jsonl"
    with open(a, "a") as f:
        f.write('{"id": "k99999", "body": "a new ticket"}\n')
    assert not inputs_unchanged(spec, store)  # grown: the manifest reads the new part
    build_manifest(spec, store)
    assert inputs_unchanged(spec, store)
    os.utime(a, ns=(a.stat().st_atime_ns, a.stat().st_mtime_ns + 10**9))
    assert not inputs_unchanged(spec, store)  # touched: the manifest looks again
    build_manifest(spec, store)
    (tmp_path / "in" / "b.jsonl").unlink()
    assert not inputs_unchanged(spec, store)  # gone: its rows leave the job
    write_jsonl(tmp_path / "in" / "b.jsonl", _rows(1000, 40))
    write_jsonl(tmp_path / "in" / "c.jsonl", _rows(2000, 5))
    assert not inputs_unchanged(spec, store)  # a new file


def test_the_basis_moves_with_the_spec_and_the_records_not_with_an_empty_generation(tmp_path):
    spec, store = _job(tmp_path)
    summaries = ShardSummaries(spec, store).all()
    before = PublishBasis.of(spec, store, summaries)
    build_manifest(spec, store)
    after = PublishBasis.of(spec, store, summaries)
    assert after.same_work(before) and after.generation == before.generation + 1
    store.write_json(f"{JobPaths(spec.name).root}/attempts/s00001/attempt-0001.intent.json", {"x": 1})
    assert not PublishBasis.of(spec, store, summaries).same_work(before)  # a record written since
    other = write_spec(tmp_path / "jobs2", base_spec_dict(str(tmp_path / "in" / "*.jsonl"), budget_usd=99))
    assert not PublishBasis.of(other, store, summaries).same_work(before)


def test_a_job_never_published_has_something_to_do(tmp_path):
    spec, store = _job(tmp_path)
    assert nothing_to_do(spec, store) is None  # nothing settled, nothing published
