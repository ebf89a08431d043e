"""SIGTERM to a running vLLM shard step (a real ``batch-pipeline run`` subprocess), then the re-run.

The step flushes what finished, releases its lease and exits; the attempt stays open (it is closed as
interrupted by the next run), and the re-run sends only the items that have no valid result yet.

The job keeps the default canary (``canary_first``, ``canary.size`` 300 of the shard's 400 items), so the
signal lands in the canary attempt: the re-run first finishes what is still pending of the canary sample,
alone (attempt 2), judges it, and only then sends the other 100 items (attempt 3).
"""

import signal
import subprocess
import time

import polars as pl

from batch_pipeline.core.ledger.attempts import AttemptLog
from batch_pipeline.core.ledger.result_parts import read_results
from batch_pipeline.core.run.lease import current_token
from batch_pipeline.core.spec.job import CanarySpec
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store

from .conftest import PY, engine_settings, python_env, stop_process, wait_for, write_job

ROWS = 400
CANARY = CanarySpec().size  # the default: 300 items of the one shard run first, alone
TOPICS = ["invoice", "refund", "password", "crash", "export", "seats", "login", "charge"]


def _rows() -> list[dict]:
    return [
        {
            "ticket_id": f"T{i:05d}",
            "subject": f"Ticket {i} about the {TOPICS[i % 8]}",
            "body": f"Hello team, ticket number {i}: the {TOPICS[i % 8]} page fails since {i % 28} days. "
            f"Please help, thanks {i * 7919 % 100000}.",
        }
        for i in range(ROWS)
    ]


def _cli(spec_path: str, home, tmp_path, prices_file) -> subprocess.Popen:
    env = python_env(DAGSTER_HOME=str(tmp_path / "dagster_home"), BATCH_PIPELINE_PRICES=str(prices_file))
    (tmp_path / "dagster_home").mkdir(exist_ok=True)
    return subprocess.Popen(
        [PY, "-m", "batch_pipeline.cli", "run", spec_path, "--home", str(home)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def test_sigterm_flushes_releases_the_lease_and_the_rerun_sends_only_the_rest(tmp_path, tiny_model, prices_file):
    # one request at a time and a part every 8 results: the shard takes long enough to be caught mid-way
    backend = {"name": "vllm", "settings": engine_settings(tiny_model, max_num_seqs=1, flush_every=8)}
    spec = write_job(tmp_path, "vsigterm", backend, _rows(), shards={"max_requests": 1000})
    home = tmp_path / "home"
    store = Store(home)
    paths = JobPaths(spec.name)
    proc = _cli(spec.source_path, home, tmp_path, prices_file)
    try:
        wait_for(
            lambda: len(store.list_files(paths.results, recursive=True, suffix=".parquet")) >= 3,
            240,
            "three flushed parts",
            proc,
            interval=0.05,
        )
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        out, _ = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        stop_process(proc)
    print(out[-3000:])
    assert proc.returncode not in (0, None), out
    assert took < 30, f"the step needed {took:.1f} s to stop"
    shard = "s00001"
    first = read_results(store, spec.name, shard)
    assert 24 <= first.height < CANARY, "the results flushed before the signal are in the store"
    assert set(first["attempt"]) == {1} and set(first["status"]) == {"succeeded"}
    token = current_token(store, spec.name, shard)
    assert store.exists(f"{paths.root}/leases/{shard}/lease-{token:06d}.released.json"), "the lease was released"
    attempts = AttemptLog(store, spec.name, shard).all()
    assert [a.number for a in attempts] == [1] and attempts[0].open  # interrupted, not marked collected
    # the signal caught the canary: attempt 1 sent only the canary sample, alone
    assert attempts[0].canary and len(attempts[0].request_ids) == CANARY
    canary_ids = set(attempts[0].request_ids)
    done_before = set(first["request_id"])
    assert done_before < canary_ids
    assert store.read_json(paths.canary_verdict) is None  # not judged: the canary did not finish

    again = _cli(spec.source_path, home, tmp_path, prices_file)
    try:
        out2, _ = again.communicate(timeout=300)
    finally:
        stop_process(again)
    assert again.returncode == 0, out2
    attempts = AttemptLog(store, spec.name, shard).all()
    # the interrupted canary is closed, the rest of its sample runs alone and is judged, then the other items
    assert [a.number for a in attempts] == [1, 2, 3]
    assert "abandoned" in attempts[0].records
    assert all("collected" in a.records for a in attempts[1:])
    assert attempts[1].canary and not attempts[2].canary
    assert set(attempts[1].request_ids) == canary_ids - done_before  # only what the canary still lacked
    verdict = store.read_json(paths.canary_verdict)
    assert verdict is not None and verdict["passed"], verdict
    resent = set(attempts[1].request_ids) | set(attempts[2].request_ids)
    assert set(attempts[1].request_ids).isdisjoint(attempts[2].request_ids)
    assert resent.isdisjoint(done_before) and len(resent) + len(done_before) == ROWS  # only the rest
    results = read_results(store, spec.name)
    ok = results.filter(pl.col("status") == "succeeded")
    assert ok.height == ROWS and ok["request_id"].n_unique() == ROWS  # each item answered exactly once
