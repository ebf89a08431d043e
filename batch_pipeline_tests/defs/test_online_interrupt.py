"""SIGTERM to a `batch-pipeline run` process in the middle of an online shard, then the re-run.

Nothing is flushed by size or time (``flush_every`` 1000, ``flush_interval_s`` 600), so every result the interrupted
process stored came from the executor's buffer (``take_unflushed``); the re-run sends only what was not billed, and
each request is billed once. The sandbox answers online requests at once; its ``rpm`` limit (learned by the client
from the ``x-ratelimit-*`` headers) is what makes the shard slow enough to be caught mid-way.
"""

import json
import os
import signal
import time
from collections import Counter

import polars as pl
import pytest

from batch_pipeline.core.ledger.result_parts import read_results
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline.sandbox import SandboxAdmin
from batch_pipeline_tests.cli_forks import CliForks, ForkedCli

ONLINE = {
    "name": "online",
    "settings": {"sandbox": True, "concurrency": 2, "flush_every": 1000, "flush_interval_s": 600},
}
ROWS = 40


def _run_cli(cli: CliForks, spec_path: str, home, dagster_home, url: str) -> ForkedCli:
    env = {**os.environ, "DAGSTER_HOME": str(dagster_home), "BATCH_PIPELINE_SANDBOX_URL": url}
    return cli.popen(["run", spec_path, "--home", str(home)], env=env, stderr_to_stdout=True)


def _collected(store: Store, job: str) -> int:
    return len(
        [p for p in store.list_files(f"{JobPaths(job).root}/attempts", recursive=True) if p.endswith(".collected.json")]
    )


def _stored(store: Store, job: str) -> pl.DataFrame:
    """request_id, status and the provider's completion id of every stored result row."""
    results = read_results(store, job, columns=["request_id", "status", "raw_payload"])
    return results.with_columns(
        pl.col("raw_payload").map_elements(lambda p: json.loads(p)["id"], return_dtype=pl.String).alias("completion_id")
    )


def _billed(admin: SandboxAdmin) -> list[str]:
    """The completion id of each billed online request (``ledger_ids`` is for batch lines: online has no custom_id)."""
    return [e["completion_id"] for e in admin.ledger() if e["mode"] == "online"]


def _wait_billed(admin: SandboxAdmin, proc: ForkedCli, count: int, timeout_s: float, why: str) -> None:
    """Poll until ``count`` online requests were billed, while ``proc`` runs (``why`` once ``timeout_s`` passed)."""
    deadline = time.monotonic() + timeout_s
    while len(_billed(admin)) < count:
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, why
        time.sleep(0.1)


@pytest.mark.timeout(900)  # its own deadlines (start, stop, re-run) add up past the 300 s default
def test_sigterm_mid_online_shard_stores_what_was_billed_and_the_rerun_bills_the_rest_once(
    cli, sandbox, sandbox_proc, make_job, home, tmp_path
):
    spec = make_job(backend=ONLINE, canary_first=False, shards={"max_requests": 20})
    _, url = sandbox_proc
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    store = Store(home)
    sandbox.set_scenario("normal", rpm=60)  # one online request a second
    proc = _run_cli(cli, spec.source_path, home, dagster_home, url)
    try:
        # the run's readiness is its first billed request: a subprocess start and the dagster import took over
        # 90 s on a loaded machine, so the start gets 300 s, then the next two billed requests (1 s apart) 120 s
        _wait_billed(sandbox, proc, 1, 300.0, "the run never billed an online request")
        _wait_billed(sandbox, proc, 3, 120.0, "the run billed one online request, then no more")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, out
    assert "Traceback" not in out and "Stack Trace" not in out, out
    assert "interrupted: finished results were stored; resume with `batch-pipeline run" in out
    billed = _billed(sandbox)
    stored = _stored(store, spec.name)
    assert _collected(store, spec.name) == 0 and 3 <= len(billed) < 20  # stopped inside the first shard
    assert set(stored["completion_id"]) == set(billed) and stored.height == len(billed), (stored, billed)
    assert set(stored["status"]) == {"succeeded"}

    sandbox.set_scenario("normal")  # no limit: the re-run goes at full speed
    again = _run_cli(cli, spec.source_path, home, dagster_home, url)
    try:
        out2, _ = again.communicate(timeout=180)
    finally:
        if again.poll() is None:
            again.kill()
            again.wait()
    assert again.returncode == 0, out2
    billed = _billed(sandbox)
    stored = _stored(store, spec.name)
    assert len(billed) == ROWS and set(billed) == set(stored["completion_id"])  # each billed answer is stored
    by_request = Counter(stored.filter(pl.col("completion_id").is_in(billed))["request_id"])
    assert len(by_request) == ROWS and set(by_request.values()) == {1}  # every request ID billed exactly once
    assert Counter(e["request_key"] for e in sandbox.ledger()).most_common(1)[0][1] == 1
