"""A run process SIGKILLed mid-collection, then re-run: it re-attaches and every request is billed once."""

import os
import signal
import time
from collections import Counter

import pytest

from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline_tests.cli_forks import CliForks, ForkedCli

from .conftest import batch_creates, ledger_ids


def _count(store: Store, job: str, suffix: str) -> int:
    return len([p for p in store.list_files(f"{JobPaths(job).root}/attempts", recursive=True) if p.endswith(suffix)])


def _run_cli(cli: CliForks, spec_path: str, home, dagster_home, url: str) -> ForkedCli:
    env = {**os.environ, "DAGSTER_HOME": str(dagster_home), "BATCH_PIPELINE_SANDBOX_URL": url}
    return cli.popen(["run", spec_path, "--home", str(home)], env=env, stderr_to_stdout=True)


@pytest.mark.timeout(600)  # two CLI runs, each given a generous deadline
def test_sigkill_mid_collection_then_rerun_bills_each_request_once(
    cli, sandbox, sandbox_proc, make_job, home, tmp_path
):
    spec = make_job()
    _, url = sandbox_proc
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    store = Store(home)
    sandbox.clock(freeze=True)  # batches stay in progress: the run sits in its collection step
    proc = _run_cli(cli, spec.source_path, home, dagster_home, url)
    try:
        deadline = time.monotonic() + 180  # generous: a loaded machine takes over a minute to start the CLI
        while time.monotonic() < deadline:
            if _count(store, spec.name, ".submitted.json") == 1:  # the canary shard is in flight
                break
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.1)
        else:
            raise AssertionError("the run never submitted its canary shard")
        deadline = time.monotonic() + 60  # now polling inside shard_results: the sandbox has seen it ask
        while not [r for r in sandbox.requests() if r["method"] == "GET" and r["path"].startswith("/v1/batches/")]:
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "the run never polled its canary batch"
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    assert _count(store, spec.name, ".collected.json") == 0
    assert batch_creates(sandbox) == 1
    sandbox.clock(freeze=False)
    again = _run_cli(cli, spec.source_path, home, dagster_home, url)
    out, _ = again.communicate(timeout=240)
    assert again.returncode == 0, out
    assert batch_creates(sandbox) == 4  # the canary re-attached, the other 3 shards once each
    billed = Counter(ledger_ids(sandbox))
    assert len(billed) == 40 and set(billed.values()) == {1}
    assert "succeeded" in out and _count(store, spec.name, ".collected.json") == 4
