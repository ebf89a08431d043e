"""SIGKILLs at random moments of an online job against the sandbox at a real ``rpm`` (issue 17): every answer is
journalled before it is counted, so each kill repays at most the requests in flight (``concurrency``), a final run
answers every source row once, and the report's spend range holds what the sandbox billed."""

import os
import random
import signal
import time
from collections import Counter

import yaml

from batch_pipeline.core.pricing.cost import load_prices
from batch_pipeline.core.publish.tables import JobState
from batch_pipeline.core.store import Store
from batch_pipeline_tests.cli_forks import CliForks, ForkedCli

from .conftest import REPO

CONCURRENCY = 8
# CI: 3 kills of a 200-request job (a few minutes with the restarts); ONLINE_KILLS_FULL=1: the 10 of 2,000
FULL = os.environ.get("ONLINE_KILLS_FULL") == "1"
ROWS = 2000 if FULL else 200
KILLS = 10 if FULL else 3
# the executor's defaults for flushing (a part every 256 answers or 5 s): before the journal, a kill lost all of it
ONLINE = {"name": "online", "settings": {"sandbox": True, "concurrency": CONCURRENCY}}


def _rows(n: int) -> list[dict]:
    return [
        {"ticket_id": f"t{i:05d}", "subject": f"Order {i}", "body": f"My invoice number {i} was charged twice"}
        for i in range(n)
    ]


def _run(cli: CliForks, spec_path: str, home, dagster_home, url: str) -> ForkedCli:
    env = {**os.environ, "DAGSTER_HOME": str(dagster_home), "BATCH_PIPELINE_SANDBOX_URL": url}
    return cli.popen(["run", spec_path, "--home", str(home)], env=env, stderr_to_stdout=True, start_new_session=True)


def _online(admin) -> list[dict]:
    return [e for e in admin.ledger() if e.get("mode") == "online"]


def test_random_sigkills_of_an_online_job_repay_at_most_the_requests_in_flight(
    cli, sandbox, sandbox_proc, make_job, home, tmp_path
):
    _, url = sandbox_proc
    spec = make_job(rows=_rows(ROWS), backend=ONLINE, canary_first=False, shards={"max_requests": 100})
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    sandbox.set_scenario("normal", rpm=1200)
    rng = random.Random(17)
    for kill in range(KILLS):
        before = len(_online(sandbox))
        proc = _run(cli, spec.source_path, home, dagster_home, url)
        target = before + rng.randint(15, 60)  # a random moment: some answers into this run
        deadline = time.monotonic() + 120
        try:
            while len(_online(sandbox)) < target:
                assert proc.poll() is None, f"kill {kill}: the run ended first: {proc.stdout.read()}"
                assert time.monotonic() < deadline, f"kill {kill}: nothing was billed"
                time.sleep(0.02)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    sandbox.set_scenario("normal")  # the final run at full speed
    final = _run(cli, spec.source_path, home, dagster_home, url)
    out, _ = final.communicate(timeout=600)
    assert final.returncode == 0, out
    billed = _online(sandbox)
    keys = Counter(e["request_key"] for e in billed)
    repaid = len(billed) - len(keys)
    assert len(keys) == ROWS  # every request answered
    assert repaid <= CONCURRENCY * KILLS, (repaid, keys.most_common(5))
    print(
        f"online kills: {KILLS} SIGKILLs of a {ROWS}-request job, concurrency {CONCURRENCY}: {repaid} repaid "
        f"(bound {CONCURRENCY * KILLS}), {len(billed)} billed"
    )
    state = JobState.load(spec, Store(home))
    counts = state.check()
    assert counts.valid == counts.expected == ROWS
    # the report's spend range holds what the sandbox billed (at the online price of the model)
    report = yaml.safe_load((Store(home).local_path(f"jobs/{spec.name}/report.json")).read_text())
    price = load_prices(REPO / "data" / "prices.yaml").lookup("online", spec.model)
    charged = sum(
        float(price.cost(e["input_tokens"], e["output_tokens"], e.get("cached_tokens") or 0, batch=False))
        for e in billed
    )
    low, high = report["cost_range_usd"]
    assert low <= charged * 1.001 and charged <= high * 1.001 + 1e-9, (low, charged, high)


def test_a_sigkill_of_the_online_tail_after_a_cancelled_batch_repays_at_most_the_requests_in_flight(
    cli, sandbox, sandbox_proc, make_job, home, tmp_path
):
    """The tail rescue: a batch still open near the deadline is cancelled (what it finished is kept), the rest goes
    online, and that online tail is SIGKILLed mid-way; the next run finishes with at most ``concurrency`` repaid."""
    from datetime import UTC, datetime, timedelta
    from pathlib import Path

    _, url = sandbox_proc
    tail = {
        "backend": {"name": "online", "settings": {"sandbox": True, "concurrency": CONCURRENCY}},
        "before_deadline_minutes": 60,
    }
    far = (datetime.now(UTC) + timedelta(hours=12)).isoformat()
    spec = make_job(rows=_rows(200), canary_first=False, shards={"max_requests": 100}, deadline=far, tail=tail)
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    sandbox.set_scenario("normal", in_progress_s=3600, rpm=1200)  # the batches stay open
    first = _run(cli, spec.source_path, home, dagster_home, url)
    deadline = time.monotonic() + 120
    try:
        while (
            sum(
                1
                for r in sandbox.requests()
                if r["method"] == "POST" and r["path"] == "/v1/batches" and r["status"] == 200
            )
            < 2
        ):
            assert first.poll() is None, first.stdout.read()
            assert time.monotonic() < deadline, "the batches were never created"
            time.sleep(0.05)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    path = Path(spec.source_path)
    text = yaml.safe_load(path.read_text())
    text["deadline"] = (datetime.now(UTC) + timedelta(minutes=20)).isoformat()  # now the deadline is near
    path.write_text(yaml.safe_dump(text))
    rescue = _run(cli, spec.source_path, home, dagster_home, url)
    deadline = time.monotonic() + 180
    try:
        while len(_online(sandbox)) < 30:  # the tail is under way online
            assert rescue.poll() is None, rescue.stdout.read()
            assert time.monotonic() < deadline, "the tail never went online"
            time.sleep(0.02)
    finally:
        os.killpg(rescue.pid, signal.SIGKILL)
        rescue.wait()
    sandbox.set_scenario("normal")
    final = _run(cli, spec.source_path, home, dagster_home, url)
    out, _ = final.communicate(timeout=600)
    assert final.returncode == 0, out
    online = _online(sandbox)
    keys = Counter(e["request_key"] for e in online)
    repaid = len(online) - len(keys)
    assert repaid <= CONCURRENCY, (repaid, keys.most_common(5))
    state = JobState.load(spec, Store(home))
    counts = state.check()
    assert counts.valid == counts.expected == 200
    batch_billed = Counter(e["custom_id"] for e in sandbox.ledger() if e.get("mode") != "online")
    assert not batch_billed or max(batch_billed.values()) == 1  # what the cancelled batches finished: paid once
