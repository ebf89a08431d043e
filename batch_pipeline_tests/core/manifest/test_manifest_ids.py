"""Request IDs as the manifest computes them: stable across processes and row order, sensitive to
everything that changes what the model is asked, blind to whitespace-only differences."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from batch_pipeline.core.manifest.shards import Manifest, build_manifest
from batch_pipeline.core.spec.loading import load_spec
from batch_pipeline.core.store import Store
from batch_pipeline_tests.core.helpers import base_spec_dict, reference_request_id, write_jsonl, write_spec


def key_to_id(store: Store, job: str) -> dict[str, str]:
    rows = Manifest(job, store).rows().to_pylist()
    mapping = {r["source_key"]: r["request_id"] for r in rows}
    assert len(mapping) == len(rows), "source keys are unique in these inputs"
    return mapping


def item_prompts(store: Store, job: str) -> dict[str, str]:
    index = Manifest(job, store).item_index(["request_id", "user_prompt"]).to_pylist()
    return {r["request_id"]: r["user_prompt"] for r in index}


@pytest.fixture(scope="module")
def demo_build(sample_data, tmp_path_factory):
    root, samples = sample_data
    spec = load_spec(root / "data" / "jobs" / "demo.yaml")
    store = Store(tmp_path_factory.mktemp("store_demo"))
    summary = build_manifest(spec, store)
    return spec, store, summary, samples


# -- the demo data ---------------------------------------------------------------------------------
def test_every_accepted_row_gets_the_documented_id(demo_build, sample_data):
    """The vectorised render + normalise + hash equals the plain-Python formula, row by row."""
    spec, store, summary, _ = demo_build
    root, _ = sample_data
    ids_by_line = {(r["source"], r["line"]): r["request_id"] for r in Manifest("demo", store).rows().to_pylist()}
    checked = 0
    for path in sorted((root / "data" / "samples" / "tickets").glob("*.jsonl")):
        for line_no, raw in enumerate(path.read_bytes().split(b"\n")[:-1], start=1):
            if (str(path), line_no) not in ids_by_line:
                continue
            row = json.loads(raw)
            assert ids_by_line[(str(path), line_no)] == reference_request_id(spec, row), (path.name, line_no)
            checked += 1
    assert checked == summary.accepted_rows == len(ids_by_line) > 250


def test_whitespace_duplicates_in_the_samples_collapse_to_their_original(demo_build):
    _, store, summary, samples = demo_build
    mapping = key_to_id(store, "demo")
    assert samples["duplicates"] > 0
    for dup, original in samples["duplicate_of"].items():
        assert mapping[dup] == mapping[original], (dup, original)
    n_over_long = len(samples["over_long_ticket_ids"])
    assert summary.duplicates_collapsed == samples["duplicates"]
    assert summary.unique_requests == summary.new_requests == samples["unique_bodies"] - n_over_long
    assert len(set(mapping.values())) == summary.unique_requests
    assert Manifest("demo", store).item_index().num_rows == summary.unique_requests


def test_ids_survive_shuffled_rows_and_a_different_file_split(demo_build, sample_data, tmp_path):
    """Same rows in another order (and cut into other files): same IDs, same key -> ID mapping."""
    spec, store, summary, _ = demo_build
    root, _ = sample_data
    lines = []
    for path in sorted((root / "data" / "samples" / "tickets").glob("*.jsonl")):
        lines.extend(path.read_bytes().split(b"\n")[:-1])
    random.Random(1234).shuffle(lines)
    new_root = tmp_path / "proj"
    cuts = [0, 50, 170, len(lines)]
    for i in range(3):
        write_jsonl(new_root / "data" / "samples" / "tickets" / f"shuffled_{i}.jsonl", lines[cuts[i] : cuts[i + 1]])
    (new_root / "data" / "jobs").mkdir(parents=True)
    (new_root / "data" / "jobs" / "demo.yaml").write_text((root / "data" / "jobs" / "demo.yaml").read_text())
    spec2 = load_spec(new_root / "data" / "jobs" / "demo.yaml")
    store2 = Store(tmp_path / "store")
    summary2 = build_manifest(spec2, store2)

    assert key_to_id(store2, "demo") == key_to_id(store, "demo")
    assert item_prompts(store2, "demo") == item_prompts(store, "demo")
    for field in (
        "input_rows",
        "accepted_rows",
        "rejected_rows",
        "unique_requests",
        "duplicates_collapsed",
        "rejects_by_reason",
        "est_input_tokens_new",
    ):
        assert getattr(summary2, field) == getattr(summary, field), field


def test_manifest_ids_are_stable_across_processes(demo_build, sample_data, tmp_path):
    """A fresh interpreter with another hash seed builds the same manifest IDs into a fresh store."""
    _, store, _, _ = demo_build
    root, _ = sample_data
    code = (
        "import sys; from batch_pipeline.core.spec.loading import load_spec; from batch_pipeline.core.store import Store; "
        "from batch_pipeline.core.manifest.shards import build_manifest; "
        "build_manifest(load_spec(sys.argv[1]), Store(sys.argv[2]))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "4242"}
    subprocess.run(
        [sys.executable, "-c", code, str(root / "data" / "jobs" / "demo.yaml"), str(tmp_path / "s")],
        env=env,
        check=True,
        timeout=120,
        capture_output=True,
    )
    other = Store(tmp_path / "s")
    assert key_to_id(other, "demo") == key_to_id(store, "demo")
    assert item_prompts(other, "demo") == item_prompts(store, "demo")


# -- small handmade inputs -------------------------------------------------------------------------
ROWS = [{"id": f"k{i}", "body": f"ticket number {i} about billing"} for i in range(12)]


def build_ids(tmp_path: Path, name: str, **overrides) -> dict[str, str]:
    data = tmp_path / "in.jsonl"
    if not data.exists():
        write_jsonl(data, ROWS)
    spec = write_spec(tmp_path / name, base_spec_dict(str(data), **overrides))
    store = Store(tmp_path / name / "store")
    build_manifest(spec, store)
    return key_to_id(store, "t")


def test_whitespace_only_differences_are_one_request(tmp_path):
    variants = [
        "hello world",
        "hello  world",
        "hello\tworld",
        "hello\xa0world",
        "hello\u2028world",
        "\n\nhello world\n",
        " \t\xa0hello \r\n world \u3000",
    ]
    rows = [{"id": f"w{i}", "body": v} for i, v in enumerate(variants)] + [{"id": "other", "body": "helloworld"}]
    write_jsonl(tmp_path / "in.jsonl", rows)
    spec = write_spec(tmp_path, base_spec_dict(str(tmp_path / "in.jsonl")))
    store = Store(tmp_path / "store")
    summary = build_manifest(spec, store)
    mapping = key_to_id(store, "t")
    assert len({mapping[f"w{i}"] for i in range(len(variants))}) == 1
    assert mapping["other"] != mapping["w0"]
    assert (summary.accepted_rows, summary.unique_requests, summary.duplicates_collapsed) == (8, 2, 6)
    prompts = item_prompts(store, "t")
    assert prompts[mapping["w0"]] == "Ticket:\nhello world"
    assert mapping["w0"] == reference_request_id(spec, {"body": "hello world"})


CHANGES = {
    "prompt version": {"prompt": {"version": "v2", "system": "You label tickets.", "template": "Ticket:\n{body}"}},
    "system prompt": {"prompt": {"version": "v1", "system": "You label tickets!", "template": "Ticket:\n{body}"}},
    "template": {"prompt": {"version": "v1", "system": "You label tickets.", "template": "Ticket: {body}"}},
    "model": {"model": "m-2"},
    "temperature": {"sampling": {"temperature": 0.7, "max_tokens": 8}},
    "max_tokens": {"sampling": {"temperature": 0, "max_tokens": 9}},
    "top_p": {"sampling": {"temperature": 0, "max_tokens": 8, "top_p": 0.9}},
    "seed": {"sampling": {"temperature": 0, "max_tokens": 8, "seed": 1}},
    "label set": {"output": {"choice": ["billing", "bug", "account"]}},
    "contract kind": {"output": {"text": {}}},
    "json schema": {"output": {"json_schema": {"type": "object", "properties": {"a": {"type": "string"}}}}},
}
NO_CHANGE = {
    "description": {"description": "something else"},
    "shards": {"shards": {"max_requests": 3, "max_bytes": 10_000}},
    "retries": {"retries": {"per_item": 5}},
    "budget": {"budget_usd": 1.5},
    "job name": {"name": "another_job"},
}


@pytest.fixture(scope="module")
def baseline_ids(tmp_path_factory):
    return build_ids(tmp_path_factory.mktemp("base"), "base")


@pytest.mark.parametrize("what", list(CHANGES))
def test_ids_change_with_every_generation_setting(what, baseline_ids, tmp_path):
    changed = build_ids(tmp_path, "changed", **CHANGES[what])
    assert changed.keys() == baseline_ids.keys()
    assert not set(changed.values()) & set(baseline_ids.values()), f"{what} did not change the request IDs"


@pytest.mark.parametrize("what", list(NO_CHANGE))
def test_ids_ignore_settings_that_do_not_change_the_request(what, baseline_ids, tmp_path):
    overrides = dict(NO_CHANGE[what])
    if "name" in overrides:  # key_to_id reads the job by name
        data = tmp_path / "in.jsonl"
        write_jsonl(data, ROWS)
        spec = write_spec(tmp_path / "x", base_spec_dict(str(data), **overrides))
        store = Store(tmp_path / "x" / "store")
        build_manifest(spec, store)
        assert key_to_id(store, "another_job") == baseline_ids
        return
    assert build_ids(tmp_path, "same", **overrides) == baseline_ids
