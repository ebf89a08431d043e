"""A chat-messages job (``input.messages_field`` + ``prompt.examples``) end to end through Dagster ``materialize()``
on ``openai_batch`` and ``anthropic_batch``: every accepted row answered once, bad rows in the rejects with their
line and field, and the sandbox (its state directory: the uploaded batch files, the stored message batches)
received system, examples and the row's turns in order for every request."""

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

from batch_pipeline.core.ledger.reconcile import check_invariant
from batch_pipeline.core.manifest import ids
from batch_pipeline.core.manifest.shards import Manifest
from batch_pipeline.core.publish.tables import JobState
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline.defs.pipeline import run_job
from batch_pipeline.sandbox import SandboxAdmin
from batch_pipeline.sandbox.process import start_sandbox_process, stop_sandbox_process

from .conftest import ledger_ids

SYSTEM = "You label customer support tickets: billing, bug, feature_request, account or other."
EXAMPLES = [
    {"role": "user", "content": "I was charged twice this month."},
    {"role": "assistant", "content": "billing"},
    {"role": "user", "content": "The app crashes when I export."},
    {"role": "assistant", "content": "bug"},
]
TOPICS = [
    "my invoice shows a refund that never arrived",
    "the export button crashes the app",
    "please add a dark mode",
    "I cannot reset my password",
    "who do I contact about a partnership",
]


def conversation(i: int) -> list[dict]:
    return [
        {"role": "user", "content": f"Hello, ticket {i} here."},
        {"role": "assistant", "content": f"Hi, how can I help with ticket {i}?"},
        {"role": "user", "content": f"{TOPICS[i % len(TOPICS)]}  (case\t{i})"},
    ]


GOOD = [{"id": f"c{i}", "messages": conversation(i)} for i in range(24)]
DUPLICATE = {
    "id": "dup",
    "messages": [{**t, "content": " " + t["content"].replace(" ", "   ") + "\n"} for t in conversation(3)],
}  # collapses onto c3 after normalisation
BAD = [
    ({"id": "b1", "messages": []}, "empty_messages", "messages"),
    ({"id": "b2", "messages": [{"content": "no role"}]}, "missing_field", "messages[0].role"),
    ({"id": "b3", "messages": [{"role": "user", "content": ["a", "list"]}]}, "wrong_type", "messages[0].content"),
    (
        {
            "id": "b4",
            "messages": [{"role": "system", "content": "Be someone else."}, {"role": "user", "content": "hi"}],
        },
        "system_turn",
        "messages[0].role",
    ),
]
ROWS = [*GOOD[:10], DUPLICATE, *[b[0] for b in BAD], *GOOD[10:]]


def normalised(turns: list[dict]) -> list[dict]:
    return [{"role": t["role"], "content": ids.normalize_text(t["content"])} for t in turns]


EXPECTED = {r["id"]: normalised(r["messages"]) for r in GOOD}


@pytest.fixture
def state_sandbox(tmp_path, monkeypatch) -> Iterator[tuple[SandboxAdmin, Path]]:
    """A sandbox of its own that keeps its state in a directory (uploaded files, stored batches), stopped by PID."""
    state = tmp_path / "sandbox_state"
    proc, url = start_sandbox_process(port=0, args=["--state-dir", str(state)])
    try:
        monkeypatch.setenv("BATCH_PIPELINE_SANDBOX_URL", url)
        yield SandboxAdmin(url), state
    finally:
        stop_sandbox_process(proc)


def messages_job(make_job, tmp_path, **overrides):
    return make_job(
        name="chat",
        rows=ROWS,
        input={"path": str(tmp_path / "data" / "in" / "*.jsonl"), "messages_field": "messages", "key_field": "id"},
        prompt={"version": "v1", "system": SYSTEM, "examples": EXAMPLES},
        **overrides,
    )


def check_job(spec, report, home, admin) -> dict[str, str]:
    """The job's figures, rejects and ledger; returns source key -> request ID."""
    store = Store(home)
    manifest = Manifest(spec.name, store)
    rows = pl.from_arrow(manifest.rows())
    assert rows.height == len(GOOD) + 1 and rows["request_id"].n_unique() == len(GOOD)
    keys = dict(zip(rows["source_key"], rows["request_id"]))
    assert keys["dup"] == keys["c3"]
    rejects = {(r["line"], r["field"], r["kind"]) for r in manifest.rejects().to_pylist()}
    assert rejects == {(ROWS.index(row) + 1, field, kind) for row, kind, field in BAD}
    assert report["complete"] and report["succeeded"] == len(GOOD) and report["dead_lettered"] == 0
    validated = pl.read_parquet(store.read_bytes(JobPaths(spec.name).validated))
    assert validated.height == rows.height and set(validated["output"]) <= set(spec.output.choice)
    state = JobState.load(spec, store)
    counts = check_invariant(state.items, state.results, state.states)
    assert counts.valid == len(GOOD) == counts.expected
    billed = Counter(ledger_ids(admin))
    assert set(billed) == set(keys.values()) and set(billed.values()) == {1}
    # the request ID hashes the normalised turns (canonical JSON), behind the job's prefix
    prefix = ids.id_prefix(spec.prompt.version, spec.model, spec.settings_fingerprint())
    for key, turns in EXPECTED.items():
        assert keys[key] == ids.request_id(prefix, json.dumps(turns, ensure_ascii=False, separators=(",", ":")))
    return {k: v for k, v in keys.items() if k != "dup"}


def test_a_messages_job_on_openai_batch_sends_system_examples_then_the_turns_in_order(
    state_sandbox, make_job, instance, resources, home, tmp_path
):
    admin, state = state_sandbox
    # retention keep: the uploaded input files stay at the provider, so the test can read what was sent
    spec = messages_job(
        make_job, tmp_path, backend={"name": "openai_batch", "settings": {"sandbox": True, "retention": "keep"}}
    )
    keys = check_job(spec, run_job(spec, instance, resources), home, admin)
    seen: dict[str, list[dict]] = {}
    for blob in (state / "files").iterdir():  # the batch input files the executor uploaded, as the sandbox keeps them
        for line in blob.read_bytes().decode().splitlines():
            request = json.loads(line)
            if isinstance(request, dict) and "body" in request:  # input lines (the output files hold results)
                seen[request["custom_id"]] = request["body"]["messages"]
    assert set(seen) == set(keys.values())
    head = [{"role": "system", "content": SYSTEM}, *EXAMPLES]
    for key, rid in keys.items():
        assert seen[rid] == [*head, *EXPECTED[key]], key


def test_a_messages_job_on_anthropic_batch_sends_system_examples_then_the_turns_in_order(
    state_sandbox, make_job, instance, resources, home, tmp_path
):
    admin, state = state_sandbox
    spec = messages_job(
        make_job,
        tmp_path,
        model="claude-haiku-4-5",
        backend={"name": "anthropic_batch", "settings": {"sandbox": True, "retention": "keep"}},
    )
    keys = check_job(spec, run_job(spec, instance, resources), home, admin)
    # an ended batch keeps the requests it was sent in the spool (files/<batch>.requests, a JSON line each)
    sent_files = sorted((state / "files").glob("msgbatch_*.requests"))
    assert sent_files, "no ended batch kept its requests"
    seen = {r["custom_id"]: r["params"] for path in sent_files for r in map(json.loads, path.read_text().splitlines())}
    assert set(seen) == set(keys.values())
    for key, rid in keys.items():
        params = seen[rid]
        assert [block["text"] for block in params["system"]] == [SYSTEM]
        sent = params["messages"]
        # the last example carries the cache breakpoint: system + examples are the cached prefix
        last = sent[len(EXAMPLES) - 1]
        assert last["content"] == [
            {"type": "text", "text": EXAMPLES[-1]["content"], "cache_control": {"type": "ephemeral"}}
        ]
        as_text = [
            {
                "role": m["role"],
                "content": m["content"] if isinstance(m["content"], str) else "".join(b["text"] for b in m["content"]),
            }
            for m in sent
        ]
        assert as_text == [*EXAMPLES, *EXPECTED[key]], key
