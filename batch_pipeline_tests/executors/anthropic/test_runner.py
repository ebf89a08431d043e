"""Anthropic through the runner: a crash between accept and record re-attaches from a fresh process state."""

import json

from batch_pipeline.core.ledger.attempts import AttemptLog
from batch_pipeline.core.ledger.executor import ShardWork
from batch_pipeline.core.manifest.shards import build_manifest
from batch_pipeline.core.run.runner import ShardRunner
from batch_pipeline.core.spec.loading import parse_spec
from batch_pipeline.core.store import Store
from batch_pipeline.executors.registry import create_executor


def test_crash_between_accept_and_record_reattaches_with_a_new_executor(admin, tmp_path):
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"body": f"invoice {i} was wrong"}) + "\n" for i in range(9)))
    spec = parse_spec(f"""
name: anth
input: {{path: {tmp_path}/in.jsonl, text_field: body}}
prompt: {{version: v1, system: "Label the ticket.", template: "{{body}}"}}
model: claude-haiku-4-5
backend: {{name: anthropic_batch, settings: {{sandbox: true}}}}
sampling: {{max_tokens: 16}}
output: {{choice: [billing, bug, other]}}
""")
    store = Store(tmp_path / "home")
    build_manifest(spec, store)
    first = create_executor(spec.backend)
    runner = ShardRunner(spec, store, first, None)
    pending = runner.pending_items("s00001")
    work = ShardWork("anth", "s00001", 1, "anth:s00001:1", runner.plan, pending)
    AttemptLog(store, "anth", "s00001").create_intent(
        1, {"key": work.key, "backend": first.name, "request_ids": work.request_ids, "requests": 9}
    )
    accepted = first.submit(work)  # the process dies here, before recording the batch
    fresh = ShardRunner(spec, store, create_executor(spec.backend), None)  # a new process: no memory of it
    outcome = fresh.submit("s00001")
    assert outcome.reattached and outcome.handle.batch_id == accepted.batch_id
    creates = [r for r in admin.requests() if r["method"] == "POST" and r["path"] == "/v1/messages/batches"]
    assert len(creates) == 1
    fresh.collect("s00001", poll_interval_s=0.05)
    assert fresh.pending_items("s00001").num_rows == 0
    billed = [e["custom_id"] for e in admin.ledger()]
    assert sorted(billed) == sorted(work.request_ids)
