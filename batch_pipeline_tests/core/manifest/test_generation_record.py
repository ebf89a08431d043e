"""Manifest generations written before they were typed (dicts without ``version``) still read, as version 1; so do
those written before version 2 stored each shard's totals (they have none: ``Manifest.shard_totals`` computes them
from the shard files)."""

import pytest
from pydantic import ValidationError

from batch_pipeline.core.manifest.generation import GENERATION_VERSION, GenerationRecord
from batch_pipeline.core.manifest.incremental import FileAction
from batch_pipeline.core.manifest.read import Manifest
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store

# exactly as ManifestBuilder.build wrote it before: ManifestSummary.as_dict, its files replaced by the file states
BEFORE = {
    "job": "j",
    "generation": 2,
    "input_files": 2,
    "input_rows": 35,
    "rejected_rows": 1,
    "accepted_rows": 34,
    "unique_requests": 230,
    "new_requests": 30,
    "duplicates_collapsed": 4,
    "known_requests": 4,
    "shards_total": 3,
    "new_shards": ["s00003"],
    "est_input_tokens_new": 2400,
    "seconds": 0.412,
    "rejects_by_reason": {"not_json": 1},
    "files": [
        {
            "uri": "file:///in/a.jsonl",
            "size": 9000,
            "mtime_ns": 1764583200000000000,
            "format": "jsonl",
            "bytes_read": 9000,
            "lines": 155,
            "ends_clean": True,
            "head_digest": "ab" * 32,
            "tail_digest": "cd" * 32,
            "row_generations": [1, 2],
            "action": "appended",
        },
        {
            "uri": "file:///in/b.jsonl",
            "size": 4000,
            "mtime_ns": None,
            "format": "jsonl",
            "bytes_read": 4000,
            "lines": 80,
            "ends_clean": True,
            "head_digest": "ef" * 32,
            "tail_digest": "01" * 32,
            "row_generations": [1],
            "action": "skipped",
        },
    ],
    "spilled": False,
}
# a generation from before incremental builds: no file states
FIRST = {"job": "j", "generation": 1, "unique_requests": 200, "shards_total": 2, "new_shards": ["s00001", "s00002"]}


def test_generations_written_before_versions_read_as_version_1(tmp_path):
    store = Store(tmp_path)
    paths = JobPaths("j")
    store.write_json(paths.generation(1), FIRST)
    store.write_json(paths.generation(2), BEFORE)
    manifest = Manifest("j", store)
    assert [g.version for g in manifest.generations()] == [1, 1] and GENERATION_VERSION == 2
    assert all(g.shard_totals is None and g.totals() is None for g in manifest.generations())
    assert manifest.last_generation() == 2 and manifest.shard_ids() == ["s00001", "s00002", "s00003"]
    latest = manifest.latest()
    assert latest is not None and latest.unique_requests == 230 and latest.files[0].action is FileAction.APPENDED
    states = manifest.file_states()
    assert states["file:///in/a.jsonl"].row_generations == [1, 2] and states["file:///in/b.jsonl"].mtime_ns is None
    assert manifest.live_parts() == {1: ["file:///in/a.jsonl", "file:///in/b.jsonl"], 2: ["file:///in/a.jsonl"]}
    # read and written back, nothing changes but the version and the totals it does not have
    assert latest.as_json() == {**BEFORE, "version": 1, "shard_totals": None}


def test_a_generation_without_file_states_lists_its_own_parts():
    old = GenerationRecord.model_validate({**FIRST, "files": {"read": [], "skipped": []}})  # a bare summary's map
    assert old.files == [] and old.input_rows == 0


def test_shard_totals_name_each_new_shard_once():
    record = GenerationRecord.model_validate(
        {**FIRST, "version": 2, "shard_totals": {"items": [120, 80], "est_input_tokens": [3000, 2000]}}
    )
    assert record.totals() == {"s00001": (120, 3000), "s00002": (80, 2000)}
    with pytest.raises(ValidationError, match="shard_totals has 1 shards, new_shards 2"):
        GenerationRecord.model_validate({**FIRST, "shard_totals": {"items": [120], "est_input_tokens": [3000]}})
    with pytest.raises(ValidationError, match="differ in length"):
        GenerationRecord.model_validate({**FIRST, "shard_totals": {"items": [120, 80], "est_input_tokens": [3000]}})
