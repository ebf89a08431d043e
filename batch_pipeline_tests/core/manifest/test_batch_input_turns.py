"""Multi-turn lines of an OpenAI / vLLM batch input file as a messages job's input: the turns after the line's
system message are the row's turns (same rule, same IDs as JSONL rows); a text job names the setting it needs."""

import json

import pyarrow as pa

from batch_pipeline.core.ledger.executor import RequestPlan, ShardWork
from batch_pipeline.core.manifest.shards import Manifest, build_manifest
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.store import Store
from batch_pipeline.executors.openai.format import request_lines

SYSTEM = "Label the ticket."
EXAMPLES = [{"role": "user", "content": "charged twice"}, {"role": "assistant", "content": "billing"}]


def spec_for(path, fmt: str, turns: bool = True) -> JobSpec:
    source = {"messages_field": "messages"} if turns else {"text_field": "user"}
    prompt = {} if turns else {"template": "{user}"}
    return JobSpec.model_validate(
        {
            "name": "fromfile",
            "input": {
                "path": str(path),
                "format": fmt,
                "key_field": "custom_id" if fmt == "openai_batch" else "id",
                **source,
            },
            "prompt": {"version": "v1", "system": SYSTEM, "examples": EXAMPLES, **prompt},
            "model": "gpt-4o-mini",
            "backend": {"name": "openai_batch"},
            "sampling": {"max_tokens": 16},
            "output": {"choice": ["billing", "bug"]},
        }
    )


def conversations() -> list[list[dict]]:
    return [
        [
            {"role": "user", "content": f"hello {i}"},
            {"role": "assistant", "content": "how can I help?"},
            {"role": "user", "content": f"the app  crashes on export {i}"},
        ]
        for i in range(4)
    ]


def items(manifest: Manifest):
    return [i for s in manifest.shard_ids() for i in manifest.shard_items(s).to_pylist()]


def test_our_own_multi_turn_batch_file_imports_back_to_the_same_ids(tmp_path):
    (tmp_path / "rows.jsonl").write_text(
        "".join(json.dumps({"id": f"r{i}", "messages": m}) + "\n" for i, m in enumerate(conversations()))
    )
    spec = spec_for(tmp_path / "rows.jsonl", "jsonl")
    store = Store(tmp_path / "home")
    build_manifest(spec, store)
    first = items(Manifest("fromfile", store))
    work = ShardWork(
        "x",
        "s",
        1,
        "k",
        RequestPlan.from_spec(spec),
        pa.table({"request_id": [i["request_id"] for i in first], "user_prompt": [i["user_prompt"] for i in first]}),
    )
    lines = request_lines(work).decode().splitlines()  # system, examples, turns: what the executor uploads
    first_line = json.loads(lines[0])
    assert first_line["body"]["messages"][:3] == [{"role": "system", "content": SYSTEM}, *EXAMPLES]
    # an imported line's turns after its system message are all the row's (a file whose lines repeat few-shot
    # turns is imported with no prompt.examples); here the spec keeps them, so the lines carry the turns after them
    own = []
    for line in lines:
        obj = json.loads(line)
        obj["body"]["messages"] = [obj["body"]["messages"][0], *obj["body"]["messages"][3:]]
        own.append(obj)
    bad_turn = json.loads(json.dumps(own[0]))
    bad_turn["custom_id"] = "bad-turn"
    bad_turn["body"]["messages"][2]["content"] = 42
    other_system = json.loads(json.dumps(own[1]))
    other_system["custom_id"] = "other-system"
    other_system["body"]["messages"][0]["content"] = "Be a pirate."
    no_system = json.loads(json.dumps(own[2]))
    no_system["custom_id"] = "no-system"
    no_system["body"]["messages"] = no_system["body"]["messages"][1:]
    developer = json.loads(json.dumps(own[3]))
    developer["custom_id"] = "developer"
    developer["body"]["messages"][0]["role"] = "developer"
    (tmp_path / "batch.jsonl").write_text(
        "\n".join(json.dumps(o) for o in [*own, bad_turn, other_system, no_system, developer]) + "\n"
    )
    imported = spec_for(tmp_path / "batch.jsonl", "openai_batch")
    store2 = Store(tmp_path / "home2")
    summary = build_manifest(imported, store2)
    manifest = Manifest("fromfile", store2)
    rows = {r["source_key"]: r["request_id"] for r in manifest.rows().to_pylist()}
    assert {rows[o["custom_id"]] for o in own} == {i["request_id"] for i in first}  # same turns, same IDs
    assert rows["developer"] == rows[own[3]["custom_id"]]
    rejects = {(r["line"], r["kind"]) for r in manifest.rejects().to_pylist()}
    assert rejects == {(5, "wrong_type"), (6, "system_turn"), (7, "system_mismatch")}
    assert "body.messages[2].content" in next(r["reason"] for r in manifest.rejects().to_pylist() if r["line"] == 5)
    assert summary.accepted_rows == 5


def test_a_text_job_rejects_multi_turn_lines_naming_messages_field(tmp_path):
    line = {
        "custom_id": "a",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "gpt-4o-mini", "messages": [{"role": "system", "content": SYSTEM}, *conversations()[0]]},
    }
    (tmp_path / "batch.jsonl").write_text(json.dumps(line) + "\n")
    store = Store(tmp_path / "home")
    build_manifest(spec_for(tmp_path / "batch.jsonl", "openai_batch", turns=False), store)
    [reject] = Manifest("fromfile", store).rejects().to_pylist()
    assert reject["kind"] == "unsupported_messages" and "input.messages_field" in reject["reason"]
