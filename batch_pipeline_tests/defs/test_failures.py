"""Systemic failures stop a job once and resume after the fix; concurrent shard runs never double-submit."""

import json
import os
import subprocess
import sys
import threading

import dagster as dg
import polars as pl
import pytest

from batch_pipeline.core.ledger.control import JobControl
from batch_pipeline.core.ledger.reconcile import DEAD
from batch_pipeline.core.publish.tables import JobState
from batch_pipeline.core.run.lease import LeaseHeldError
from batch_pipeline.core.run.runner import ShardRunner
from batch_pipeline.core.store import Store
from batch_pipeline.defs.pipeline import run_job
from batch_pipeline.executors.registry import create_executor

from .conftest import batch_creates, ledger_ids

BODIES = [
    "My card was charged twice for the March invoice.",
    "The export button crashes the app.",
    "Please add a dark mode.",
    "I cannot log in after the password reset.",
    "Just saying hello.",
]


def rows(n: int) -> list[dict]:
    return [{"ticket_id": f"T{i}", "subject": f"case {i}", "body": f"{BODIES[i % 5]} Reference {i}."} for i in range(n)]


def test_bad_key_on_a_5000_item_job_stops_once_then_resumes_after_the_fix(
    sandbox, instance, resources, home, make_job, monkeypatch
):
    spec = make_job(rows=rows(5000), shards={"max_requests": 500})
    monkeypatch.setenv("OPENAI_API_KEY", "sk-sandbox-bad")
    with pytest.raises(dg.Failure) as failure:
        run_job(spec, instance, resources)
    message = failure.value.description
    assert "401" in message and "API key" in message and "sk-sandbox-bad" not in message
    log = sandbox.requests()
    uploads = [r for r in log if r["path"] == "/v1/files" and r["method"] == "POST"]
    assert len(uploads) == 1 and uploads[0]["status"] == 401  # one failed submission, not one per shard
    store = Store(home)
    state = JobState.load(spec, store)
    assert state.results.height == 0 and state.states.filter(pl.col("state") == DEAD).height == 0
    stop = JobControl(store, spec.name).current()
    assert stop is not None and "401" in stop.reason
    # the fix: a good key; the user resumes (the CLI clears the stop), and the same job completes
    monkeypatch.setenv("OPENAI_API_KEY", "sk-sandbox")
    JobControl(store, spec.name).clear()
    report = run_job(spec, instance, resources)
    assert report["complete"] and report["succeeded"] == 5000 and report["dead_lettered"] == 0
    assert len(set(ledger_ids(sandbox))) == 5000 == len(sandbox.ledger())


def test_two_concurrent_submissions_of_one_shard_make_one_batch(sandbox, home, make_job):
    spec = make_job()
    from batch_pipeline.core.manifest.shards import build_manifest

    store = Store(home)
    build_manifest(spec, store)
    start = threading.Barrier(2)
    outcomes: list = []

    def submit() -> None:
        runner = ShardRunner(spec, store, create_executor(spec.backend), None)
        start.wait()
        try:
            outcomes.append(runner.submit("s00001"))
        except LeaseHeldError as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=submit) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert batch_creates(sandbox) == 1
    submitted = [o for o in outcomes if not isinstance(o, Exception) and o.handle is not None]
    assert len(submitted) >= 1 and len({o.handle.batch_id for o in submitted}) == 1


def test_two_concurrent_shard_runs_in_separate_processes_make_one_batch(
    sandbox, sandbox_proc, home, make_job, tmp_path
):
    spec = make_job()
    from batch_pipeline.core.manifest.shards import build_manifest

    build_manifest(spec, Store(home))
    _, url = sandbox_proc
    script = (
        "import sys, json\n"
        "from batch_pipeline.core.spec.loading import load_spec\n"
        "from batch_pipeline.core.store import Store\n"
        "from batch_pipeline.core.run.runner import ShardRunner\n"
        "from batch_pipeline.core.run.lease import LeaseHeldError\n"
        "from batch_pipeline.executors.registry import create_executor\n"
        "spec = load_spec(sys.argv[1]); store = Store(sys.argv[2])\n"
        "runner = ShardRunner(spec, store, create_executor(spec.backend), None)\n"
        "sys.stdin.readline()\n"
        "try:\n"
        "    out = runner.submit('s00001'); print(json.dumps({'batch': out.handle.batch_id if out.handle else None}))\n"
        "except LeaseHeldError as e:\n"
        "    print(json.dumps({'held': str(e)}))\n"
    )
    env = {**os.environ, "BATCH_PIPELINE_SANDBOX_URL": url}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, spec.source_path, str(home)],
            env=env,
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    for p in procs:  # both are loaded and waiting; release them together
        p.stdin.write("go\n")
        p.stdin.flush()
    outs = [json.loads(p.communicate(timeout=60)[0].strip().splitlines()[-1]) for p in procs]
    assert batch_creates(sandbox) == 1, outs
    batches = {o["batch"] for o in outs if o.get("batch")}
    assert len(batches) == 1
