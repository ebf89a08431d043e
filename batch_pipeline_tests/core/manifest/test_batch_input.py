"""An OpenAI / vLLM batch input file as job input: rows flattened, foreign settings rejected with reasons."""

import json

import pyarrow as pa

from batch_pipeline.core.ledger.executor import RequestPlan, ShardWork
from batch_pipeline.core.manifest.shards import Manifest, build_manifest
from batch_pipeline.core.spec.loading import parse_spec
from batch_pipeline.core.store import Store
from batch_pipeline.executors.openai.format import request_lines

SYSTEM = "Label the ticket."


def spec_for(path) -> object:
    return parse_spec(f"""
name: fromfile
input: {{path: {path}, format: openai_batch, text_field: user, key_field: custom_id}}
prompt: {{version: v1, system: "{SYSTEM}", template: "{{user}}"}}
model: gpt-4o-mini
backend: {{name: openai_batch, settings: {{sandbox: true}}}}
sampling: {{max_tokens: 16}}
output: {{choice: [billing, bug, other]}}
""")


def test_batch_input_file_becomes_items_keyed_by_custom_id(tmp_path):
    spec = spec_for(tmp_path / "batch.jsonl")
    texts = ["card charged twice", "app crashes on export", "hello  there", "hello there"]  # the last two collapse
    work = ShardWork(
        "x",
        "s",
        1,
        "k",
        RequestPlan.from_spec(spec),
        pa.table({"request_id": [f"req-{i}" for i in range(4)], "user_prompt": texts}),
    )
    good = request_lines(work).decode().splitlines()  # the exact files our own OpenAI executor uploads
    other_system = json.loads(good[0])
    other_system["custom_id"] = "req-x"
    other_system["body"]["messages"][0]["content"] = "Something else entirely."
    multi_turn = json.loads(good[1])
    multi_turn["custom_id"] = "req-y"
    multi_turn["body"]["messages"].append({"role": "assistant", "content": "bug"})
    get = {"custom_id": "req-z", "method": "GET", "url": "/v1/models", "body": {}}
    lines = good + [json.dumps(other_system), json.dumps(multi_turn), json.dumps(get), "{broken"]
    (tmp_path / "batch.jsonl").write_text("\n".join(lines) + "\n")
    store = Store(tmp_path / "home")
    summary = build_manifest(spec, store)
    assert summary.accepted_rows == 4 and summary.new_requests == 3 and summary.duplicates_collapsed == 1
    assert summary.rejects_by_reason == {
        "system_mismatch": 1,
        "unsupported_messages": 1,
        "unsupported_request": 1,
        "bad_json": 1,
    }
    [broken] = [r for r in Manifest("fromfile", store).rejects().to_pylist() if r["kind"] == "bad_json"]
    assert (
        broken["reason"] == "bad JSON: expected a key in double quotes at column 2 (a trailing comma, or a key "
        "in single quotes?)"
    ), broken  # plain English, not "Expecting property name ..."
    rows = Manifest("fromfile", store).rows().to_pylist()
    assert [r["source_key"] for r in rows] == ["req-0", "req-1", "req-2", "req-3"]
    assert [r["line"] for r in rows] == [1, 2, 3, 4]
    prompts = {
        i["user_prompt"]
        for s in Manifest("fromfile", store).shard_ids()
        for i in Manifest("fromfile", store).shard_items(s).to_pylist()
    }
    assert prompts == {"card charged twice", "app crashes on export", "hello there"}
