"""Provider quotas with real processes (issue 16): `batch-pipeline run` subprocesses on one home and one account,
against the sandbox's enqueued-token cap over HTTP.

- Two jobs at once share the account's queue through the capacity ledger on the home: both finish, the cap is
  never passed (nor refused), and their batches are in the queue at the same time.
- A run SIGKILLed right after a reservation (``after_reserve``): the dead reservation stops holding room once its
  hold ttl passes (another job gets in), and the job's next run finishes it.
- A run SIGKILLed after the provider created the batch and before it was recorded (``after_create``): the next
  run finds the batch (no second create), binds it, finishes, and the ledger ends empty.

The kills are real (``BATCH_PIPELINE_CRASH_AT``, core/run/faults.py). Every wait polls a condition up to a
generous deadline.
"""

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from batch_pipeline.core.ledger.attempts import AttemptLog
from batch_pipeline.core.ledger.capacity import CapacityLedger, Need
from batch_pipeline.core.manifest.read import Manifest
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.spec.quota import QuotaSpec
from batch_pipeline.core.store import Store
from batch_pipeline_tests.cli_forks import CliForks
from batch_pipeline_tests.quota_support import (
    Sizes,
    assert_finished_once,
    assert_queue_shared,
    assert_within_cap,
    at,
    batch_owners,
    ledger_of,
    openai_events,
    reservations,
    spans,
    write_spec,
)

from .conftest import batch_creates

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # the bounds below, not the global 300 s

RUN_TIMEOUT_S = 420.0  # a bound, not a timing: a loaded 2-core machine must not fail a correct run
# 40 rows dealt 5 to a shard: 8 shards a job, 16 for the two, through a queue that holds 3. Each turn of the CLI's
# queue loop is a quote, a submit and a collect run (~6 s on an idle 2-core machine): with 2 requests a shard (24
# shards a job) the two-job test takes ~200 s here, with 5 ~70 s.
SHARD_REQUESTS = 5
# BATCH_PIPELINE_LEASE_TTL_S in the reservation-kill test: the hold ttl of a reservation never bound to a batch (and
# the shard leases' ttl). The test reads the ledger within it right after the kill (milliseconds later); it also
# bounds every live reservation's reserve-to-create time, so it is not much smaller
TTL_S = 15


@pytest.fixture(scope="module")
def sizes(sandbox_proc, tmp_path_factory) -> Sizes:
    _, url = sandbox_proc
    return Sizes.probe(url, tmp_path_factory.mktemp("probe"))


# -- processes -----------------------------------------------------------------------------------------------------
class Run:
    """One `batch-pipeline run <spec>` process, its output in a file."""

    def __init__(self, cli: CliForks, spec: JobSpec, home: Path, dagster_home: Path, url: str, out: Path, **env: str):
        self.spec, self.out = spec, out
        full = {
            **os.environ,
            "DAGSTER_HOME": str(dagster_home),
            "BATCH_PIPELINE_HOME": str(home),
            "BATCH_PIPELINE_SANDBOX_URL": url,
        }
        for name in (
            "BATCH_PIPELINE_CRASH_AT",
            "BATCH_PIPELINE_CRASH_AFTER",
            "BATCH_PIPELINE_LEASE_TTL_S",
            "OPENAI_API_KEY",
        ):
            full.pop(name, None)
        full.update(env)
        with out.open("w") as output:
            self.proc = cli.popen(["run", spec.source_path, "--home", str(home)], env=full, output=output)

    def wait(self, timeout: float = RUN_TIMEOUT_S) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"{self.spec.name}: `batch-pipeline run` did not end within {timeout} s:\n{self.output()}"
            ) from None

    def output(self) -> str:
        return self.out.read_text(errors="replace")[-6000:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def runs() -> Iterator[list[Run]]:
    """Every run a test starts; whatever is still alive at the end is stopped by its PID."""
    started: list[Run] = []
    yield started
    for r in started:
        r.kill()


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.1)


# -- the tests -----------------------------------------------------------------------------------------------------
def test_two_jobs_at_once_share_the_accounts_queue_without_passing_its_cap(
    cli, sandbox, sandbox_proc, sizes, tmp_path, runs
):
    _, url = sandbox_proc
    assert len(sizes.shards(SHARD_REQUESTS)) >= 8
    cap = sizes.cap(SHARD_REQUESTS)  # holds the three largest shards of one job at once
    sandbox.set_scenario("normal", quota_enqueued_tokens=cap, in_progress_s=1.0)
    home, dagster_home = tmp_path / "home", tmp_path / "dagster_home"
    specs = [write_spec(tmp_path, name, SHARD_REQUESTS, version=f"v1-{name}", cap=cap) for name in ("qa", "qb")]
    # the provider's clock stands still until both jobs have a batch in its queue: a batch of one job does not keep
    # the other job out (a batch ends 1 s after its create, quicker than a loaded machine starts a process)
    sandbox.clock(freeze=True)
    runs += [Run(cli, spec, home, dagster_home, url, tmp_path / f"{spec.name}.out") for spec in specs]
    wait_until(
        lambda: set(batch_owners(home, specs).values()) == {"qa", "qb"} or any(r.proc.poll() is not None for r in runs),
        RUN_TIMEOUT_S,
        "both jobs had a batch in the queue",
    )
    sandbox.clock(freeze=False)
    for r in runs:
        assert r.wait() == 0, f"{r.spec.name} exited {r.proc.returncode}:\n{r.output()}"

    assert_finished_once(home, specs, sandbox)
    # no refusal, never past the cap, and the two jobs' batches (told apart by our attempt logs) were in the
    # queue at the same time
    assert_queue_shared(sandbox, home, specs, cap)
    assert ledger_of(home).snapshot().holdings == ()  # every reservation released when its batch ended


def test_a_run_killed_after_its_reservation_holds_no_room_past_the_hold_ttl(
    cli, sandbox, sandbox_proc, sizes, tmp_path, runs
):
    _, url = sandbox_proc
    shards = sizes.shards(20)  # two shards a job: the canary, then one more
    assert len(shards) == 2
    cap = int(max(shards.values()) * 1.25)  # the queue holds one shard at a time, never two
    sandbox.set_scenario("normal", quota_enqueued_tokens=cap, in_progress_s=1.0)
    home, dagster_home = tmp_path / "home", tmp_path / "dagster_home"
    qa, qb = (write_spec(tmp_path, name, 20, version=f"v1-{name}", cap=cap) for name in ("qa", "qb"))
    ttl = {"BATCH_PIPELINE_LEASE_TTL_S": str(TTL_S)}

    killed = Run(
        cli, qa, home, dagster_home, url, tmp_path / "qa-killed.out", BATCH_PIPELINE_CRASH_AT="after_reserve", **ttl
    )
    runs.append(killed)
    assert killed.wait() == -signal.SIGKILL, f"the run never reached after_reserve:\n{killed.output()}"
    [dead] = reservations(home)
    assert dead["job"] == "qa" and dead["bound"] is None and dead["released"] is None, dead
    assert not AttemptLog(Store(home), "qa", dead["shard_id"]).all(), "an intent followed the reservation"
    assert batch_creates(sandbox) == 0

    # within its hold ttl the dead reservation holds its place, as every job on the home sees the ledger: no
    # other shard fits beside it (it may be a create in flight)
    ledger = CapacityLedger(
        Store(home), ledger_of(home).scope, QuotaSpec(enqueued_tokens=cap), hold_ttl=timedelta(seconds=TTL_S)
    )
    snapshot = ledger.snapshot()
    assert datetime.now(UTC) - at(dead) < timedelta(seconds=TTL_S), "raise TTL_S: the check came after the ttl"
    assert [h.number for h in snapshot.holdings] == [dead["number"]]
    assert not snapshot.fits(Need(tokens=min(shards.values()), requests=1, jobs=1))

    # another job on the same home and account gets room once the ttl has passed
    other = Run(cli, qb, home, dagster_home, url, tmp_path / "qb.out", **ttl)
    runs.append(other)
    wait_until(
        lambda: any(r["job"] == "qb" for r in reservations(home)) or other.proc.poll() is not None,
        RUN_TIMEOUT_S,
        "the second job got room in the queue",
    )
    assert other.proc.poll() in (None, 0), other.output()
    first = next(r for r in reservations(home) if r["job"] == "qb")
    released = next(r for r in reservations(home) if r["number"] == dead["number"])["released"]
    assert released is not None and "never bound to a batch" in released["why"], released
    assert at(released) - at(dead) >= timedelta(seconds=TTL_S), (dead, released)
    assert at(first) >= at(released), "the second job was admitted beside the dead reservation"
    assert dead["tokens"] + first["tokens"] > cap >= first["tokens"]  # the two never fit together; one alone does

    # the killed job's next run finishes it (beside the other job)
    resumed = Run(cli, qa, home, dagster_home, url, tmp_path / "qa.out", **ttl)
    runs.append(resumed)
    for r in (other, resumed):
        assert r.wait() == 0, f"{r.spec.name} exited {r.proc.returncode}:\n{r.output()}"
    assert_finished_once(home, [qa, qb], sandbox)
    assert_within_cap(sandbox, cap)
    assert ledger_of(home).snapshot().holdings == ()  # the resumed run's own reservations were released too


def test_a_run_killed_after_the_create_reattaches_and_the_ledger_ends_empty(
    cli, sandbox, sandbox_proc, sizes, tmp_path, runs
):
    _, url = sandbox_proc
    cap = sizes.cap(SHARD_REQUESTS)
    sandbox.set_scenario("normal", quota_enqueued_tokens=cap, in_progress_s=1.0)
    home, dagster_home = tmp_path / "home", tmp_path / "dagster_home"
    spec = write_spec(tmp_path, "qc", SHARD_REQUESTS, cap=cap)

    # the third create (the canary's, then two shards of the first turn of the queue loop): created, not recorded
    killed = Run(
        cli,
        spec,
        home,
        dagster_home,
        url,
        tmp_path / "killed.out",
        BATCH_PIPELINE_CRASH_AT="after_create",
        BATCH_PIPELINE_CRASH_AFTER="3",
    )
    runs.append(killed)
    assert killed.wait() == -signal.SIGKILL, f"the run never reached its third create:\n{killed.output()}"
    assert batch_creates(sandbox) == 3
    at_provider = set(spans(openai_events(sandbox)))
    store = Store(home)
    logs = {shard: AttemptLog(store, spec.name, shard) for shard in Manifest(spec.name, store).shard_ids()}
    [(shard, orphan)] = [(s, a) for s, log in logs.items() for a in log.all() if a.open and not a.submitted]
    [held] = [r for r in reservations(home) if (r["shard_id"], r["attempt"]) == (shard, orphan.number)]
    assert held["bound"] is None and held["released"] is None, held  # its place is reserved, not yet bound

    resumed = Run(cli, spec, home, dagster_home, url, tmp_path / "resumed.out")
    runs.append(resumed)
    assert resumed.wait() == 0, resumed.output()

    # the orphan's batch was found at the provider and holds its place: its own reservation, bound to that batch
    [after] = [a for a in logs[shard].all() if a.number == orphan.number]
    assert after.submitted and after.submitted.reattached, after.records
    batch_id = after.submitted.batch_id
    assert batch_id in at_provider
    [held] = [r for r in reservations(home) if r["number"] == held["number"]]
    assert held["bound"] and held["bound"]["batch_id"] == batch_id, held
    # every batch created once: one create per batch our attempt logs record, and none again after the kill
    submitted = [a.submitted.batch_id for log in logs.values() for a in log.all() if a.submitted]
    assert len(submitted) == len(set(submitted)) == batch_creates(sandbox), "a batch was created twice"
    assert at_provider <= set(submitted)
    assert_finished_once(home, [spec], sandbox)
    assert_within_cap(sandbox, cap)
    assert ledger_of(home).snapshot().holdings == ()


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_sigterm_while_the_run_waits_for_room_in_the_queue_stops_it(
    cli, sandbox, sandbox_proc, sizes, tmp_path, runs, sigint
):
    """SIGTERM between two Dagster runs (the queue loop's wait for room) stops the run with 143 and its message,
    also when it was started with SIGINT ignored, as a script's background job (``cmd &``) is: Dagster sets SIGTERM
    to SIGINT's handler after each of its runs, and an ignored SIGTERM was dropped, the run waiting on."""
    _, url = sandbox_proc
    shards = sizes.shards(20)  # two shards
    assert len(shards) == 2
    cap = int(max(shards.values()) * 1.25)  # the queue holds one shard at a time, never two
    sandbox.set_scenario("normal", quota_enqueued_tokens=cap, in_progress_s=1.0)
    sandbox.clock(freeze=True)  # the first batch never ends: the second shard waits for room
    home, dagster_home = tmp_path / "home", tmp_path / "dagster_home"
    spec = write_spec(tmp_path, "qa", 20, cap=cap, canary_first=False)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if sigint == "ignored" else None
    try:
        run = Run(cli, spec, home, dagster_home, url, tmp_path / "qa.out")
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    runs.append(run)
    wait_until(
        lambda: "waiting for room in the account's queue" in run.output() or run.proc.poll() is not None,
        RUN_TIMEOUT_S,
        "the run waited for room in the queue",
    )
    assert run.proc.poll() is None, run.output()
    run.proc.send_signal(signal.SIGTERM)
    assert run.wait(timeout=120) == 143, run.output()  # a bound for a loaded machine; it stopped in ~2 s here
    assert "interrupted: finished results were stored; resume with `batch-pipeline run" in run.output()
    assert batch_creates(sandbox) == 1  # the second shard was never sent
