"""Shard leases and fencing, for real: racing owners, takeovers (expired, or a dead holder on this host), renewals,
and a real ``ShardRunner`` against the sandbox losing its lease mid-run and writing nothing more.

Only the takeover is staged (another owner's ``acquire`` at a chosen moment, from a callback or a stall of the
provider's download/stream); the lease, the runner, the executors and the sandbox are the real ones.
"""

import json
import socket
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest

from batch_pipeline.core.errors import ConfigError, StaleAttemptError
from batch_pipeline.core.ledger.attempts import AttemptLog
from batch_pipeline.core.manifest.shards import build_manifest
from batch_pipeline.core.run import lease as lease_module
from batch_pipeline.core.run.lease import LeaseHeldError, acquire, current_token
from batch_pipeline.core.run.runner import ShardRunner
from batch_pipeline.core.settings import Settings
from batch_pipeline.core.spec.loading import parse_spec
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline.executors.registry import create_executor

JOB, SHARD = "fence", "s00001"
SHORT_TTL_S = 0.3  # the runner's lease in the mid-run takeover tests
LONG = timedelta(minutes=5)  # the taking-over owner's lease: it must not expire during a test


def expiry_of(store: Store, lease) -> datetime:
    return datetime.fromisoformat(store.read_json(lease._rel(lease.token))["expires_at"])


class WallClock:
    """The lease module's wall clock, stopped: it moves only by ``advance``, so a ttl runs out when the test says and
    never because a loaded machine was slow between two steps."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.at = datetime.now(UTC)
        clock = self

        class Stopped(datetime):
            @classmethod
            def now(cls, tz=None):  # type: ignore[override]
                return clock.at if tz is None else clock.at.astimezone(tz)

        monkeypatch.setattr(lease_module, "datetime", Stopped)

    def advance(self, seconds: float) -> None:
        self.at += timedelta(seconds=seconds)


# -- the lease itself ---------------------------------------------------------------------------------------------
def race(store: Store, shard: str, owners: list[str]) -> tuple[list, list[tuple[str, str]]]:
    """Every owner calls ``acquire`` at the same moment: (the leases won, (owner, message) of each refusal)."""
    go = threading.Barrier(len(owners))
    won, lost = [], []

    def contend(owner: str) -> None:
        go.wait()
        try:
            won.append(acquire(store, JOB, shard, owner=owner, ttl=LONG))
        except LeaseHeldError as exc:
            lost.append((owner, str(exc)))

    threads = [threading.Thread(target=contend, args=(owner,)) for owner in owners]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return won, lost


def test_two_owners_race_for_a_shard_exactly_one_wins_and_the_other_is_told_who_and_until_when(tmp_path):
    store = Store(tmp_path)
    for round_ in range(40):  # a fresh shard each round: both race to create its first lease
        won, lost = race(store, f"s{round_:05d}", ["host-a:100:a", "host-b:101:b"])
        assert len(won) == 1 and len(lost) == 1, (won, lost)
        winner = won[0]
        assert winner.token == 1 and winner.is_current()
        loser, message = lost[0]
        assert loser != winner.owner
        assert winner.owner in message and expiry_of(store, winner).isoformat() in message, message
    # and when both race to take over an expired lease, one of them gets the next token
    old = acquire(store, JOB, "expired", owner="remote-host:1:old", ttl=timedelta(seconds=0.05))
    time.sleep(0.1)
    won, lost = race(store, "expired", ["host-a:100:a", "host-b:101:b"])
    assert len(won) == 1 and won[0].token == old.token + 1 and won[0].owner in lost[0][1]
    assert not old.is_current()


def test_an_expired_lease_of_a_live_remote_holder_is_taken_over_and_the_old_holder_is_fenced(tmp_path, monkeypatch):
    clock = WallClock(monkeypatch)
    store = Store(tmp_path)
    old = acquire(store, JOB, SHARD, owner="remote-host:4242:old", ttl=timedelta(seconds=0.3))
    clock.advance(0.29)
    with pytest.raises(LeaseHeldError, match=r"leased by remote-host:4242:old until"):
        acquire(store, JOB, SHARD, owner="remote-host:7:new", ttl=LONG)
    clock.advance(0.02)  # the remote holder is not known to be dead: only its expiry frees the shard
    new = acquire(store, JOB, SHARD, owner="remote-host:7:new", ttl=LONG)
    assert new.token == old.token + 1 == current_token(store, JOB, SHARD)
    with pytest.raises(StaleAttemptError, match=r"token 1 of remote-host:4242:old is stale; refusing to write"):
        old.check("write a result part")
    with pytest.raises(StaleAttemptError):
        old.renew()
    old.release()  # a stale holder's release is a no-op: it cannot free the new holder's lease
    assert new.is_current()
    with pytest.raises(LeaseHeldError, match="remote-host:7:new"):
        acquire(store, JOB, SHARD, owner="remote-host:8:third", ttl=LONG)


def test_a_holder_on_this_host_whose_process_is_gone_is_taken_over_at_once(tmp_path):
    store = Store(tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        held = acquire(store, JOB, SHARD, owner=f"{socket.gethostname()}:{proc.pid}:crashed", ttl=LONG)
        with pytest.raises(LeaseHeldError, match=str(proc.pid)):  # alive: its lease holds for the whole ttl
            acquire(store, JOB, SHARD, owner="remote-host:7:new", ttl=LONG)
    finally:
        proc.kill()
        proc.wait()  # reaped: the PID is gone
    new = acquire(store, JOB, SHARD, owner="remote-host:7:new", ttl=LONG)  # no waiting for the 5-minute expiry
    assert new.token == held.token + 1
    with pytest.raises(StaleAttemptError):
        held.check("mark the attempt collected")


def test_a_takeover_says_why_the_holder_is_gone_or_how_long_ago_its_lease_expired(tmp_path, caplog):
    store = Store(tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        held = acquire(store, JOB, SHARD, owner=f"{socket.gethostname()}:{proc.pid}:crashed", ttl=LONG)
    finally:
        proc.kill()
        proc.wait()
    until = expiry_of(store, held)
    with caplog.at_level("WARNING", logger="batch_pipeline.core.run.lease"):
        acquire(store, JOB, SHARD, owner="remote-host:7:new", ttl=timedelta(seconds=0.2))
    [dead] = [r.getMessage() for r in caplog.records if "taking over" in r.getMessage()]
    # the holder's lease still had minutes to run: the reason is its dead process, not an expiry in the future
    assert (
        f"taking over lease 1 of {socket.gethostname()}:{proc.pid}:crashed: its process (pid {proc.pid} on this "
        f"host) is gone; its lease would have run until {until.isoformat(timespec='seconds')}" in dead
    ), dead
    assert "expired at" not in dead
    caplog.clear()
    time.sleep(0.3)  # the remote holder's lease runs out; its process cannot be checked from here
    with caplog.at_level("WARNING", logger="batch_pipeline.core.run.lease"):
        acquire(store, JOB, SHARD, owner="remote-host:8:third", ttl=LONG)
    [expired] = [r.getMessage() for r in caplog.records if "taking over" in r.getMessage()]
    assert "taking over lease 2 of remote-host:7:new: its lease expired at " in expired, expired
    stamp = expired.split("expired at ", 1)[1].split(",", 1)[0]
    assert datetime.fromisoformat(stamp) < datetime.now(UTC), expired  # a time in the past
    assert " s ago, without a renewal" in expired and "process" not in expired


def test_a_renewed_lease_extends_its_expiry_and_keeps_contenders_out_past_the_first_one(tmp_path, monkeypatch):
    clock = WallClock(monkeypatch)
    store = Store(tmp_path)
    ttl = 60.0  # a third of it (the heartbeat's own monotonic wait) never passes by itself during the test
    lease = acquire(store, JOB, SHARD, owner="remote-host:1:holder", ttl=timedelta(seconds=ttl))
    first = expiry_of(store, lease)
    assert lease.heartbeat() is False  # not a third of the ttl yet: no write
    lease.renewed_at -= ttl / 3  # a third of the ttl has passed for the holder ...
    clock.advance(ttl / 3)  # ... and for the wall clock
    assert lease.heartbeat() is True
    renewed = expiry_of(store, lease)
    assert renewed == first + timedelta(seconds=ttl / 3)
    clock.advance(ttl * 2 / 3 + 1)  # the first expiry has passed, the renewed one has not
    with pytest.raises(LeaseHeldError, match=renewed.isoformat().replace("+", r"\+")):
        acquire(store, JOB, SHARD, owner="remote-host:2:contender", ttl=LONG)
    assert lease.is_current() and lease.token == 1


def test_the_lease_ttl_comes_from_the_settings_with_the_store(tmp_path):
    """The ttl travels with the store the edge built: 15 minutes, or ``$BATCH_PIPELINE_LEASE_TTL_S`` seconds."""
    home = {"BATCH_PIPELINE_HOME": str(tmp_path / "home")}
    plain = Store.of(Settings.from_env(home))
    assert plain.lease_ttl == timedelta(minutes=15)
    assert acquire(plain, JOB, SHARD).ttl == timedelta(minutes=15)
    short = Store.of(Settings.from_env({**home, "BATCH_PIPELINE_LEASE_TTL_S": "2.5"}))
    assert acquire(short, JOB, "s00002").ttl == timedelta(seconds=2.5)
    with pytest.raises(ConfigError, match="BATCH_PIPELINE_LEASE_TTL_S"):
        Settings.from_env({**home, "BATCH_PIPELINE_LEASE_TTL_S": "0"})


# -- a real runner against the sandbox loses its lease mid-run ---------------------------------------------------
def make_job(tmp_path, backend: str, n: int = 8, ttl: timedelta = timedelta(seconds=SHORT_TTL_S)):
    (tmp_path / "in.jsonl").write_text(
        "".join(json.dumps({"body": f"ticket {i}: my invoice was wrong"}) + "\n" for i in range(n))
    )
    spec = parse_spec(f"""
name: {JOB}
input: {{path: {tmp_path}/in.jsonl, text_field: body}}
prompt: {{version: v1, system: "Label it.", template: "{{body}}"}}
model: gpt-4o-mini
backend: {backend}
sampling: {{max_tokens: 16}}
output: {{choice: [billing, bug, other]}}
""")
    store = Store(tmp_path / "home", lease_ttl=ttl)  # the runner's lease: short, so that a stall outlives it
    build_manifest(spec, store)
    return spec, store


def parts(store: Store, attempt: int) -> list[str]:
    prefix = f"attempt-{attempt:04d}-"
    return [
        p
        for p in store.list_files(f"{JobPaths(JOB).results}/{SHARD}", suffix=".parquet")
        if p.rsplit("/", 1)[1].startswith(prefix)
    ]


def take_over(store: Store, owner: str = "other-host:77:taker"):
    """Another run takes the shard once the stalled holder's lease has expired (it asks until it may)."""
    deadline = time.monotonic() + 60  # a generous deadline: a loaded machine is slow, not wrong
    while True:
        try:
            return acquire(store, JOB, SHARD, owner=owner, ttl=LONG)
        except LeaseHeldError:
            if time.monotonic() > deadline:
                raise
            time.sleep(SHORT_TTL_S / 10)


def finisher(spec, store, taken, **kwargs) -> ShardRunner:
    """The run that took over finishes the shard (its lease given back first, so that its runner can take it)."""
    taken.release()
    return ShardRunner(spec, store, create_executor(spec.backend), None, owner=taken.owner, **kwargs)


BATCH = "{name: openai_batch, settings: {sandbox: true}}"
STREAM = "{name: online, settings: {sandbox: true, concurrency: 1, flush_every: 2}}"


def test_a_batch_collection_that_lost_its_lease_while_polling_writes_no_result_part(admin, tmp_path, monkeypatch):
    spec, store = make_job(tmp_path, BATCH)
    runner = ShardRunner(spec, store, create_executor(spec.backend), None)
    submitted = runner.submit(SHARD)
    taker = []

    def stall_then_lose_the_lease(shard_id, status):
        if status.state.ended and not taker:  # the holder stalls right before its download, past its ttl
            taker.append(take_over(store))

    with pytest.raises(StaleAttemptError, match="refusing to write a result part"):
        runner.collect(SHARD, poll_interval_s=0.05, on_status=stall_then_lose_the_lease)
    assert taker and parts(store, submitted.attempt) == []  # not one row from the stale attempt
    assert "collected" not in AttemptLog(store, JOB, SHARD).events(submitted.attempt)

    rest = finisher(spec, store, taker[0])
    outcome = rest.collect(SHARD, poll_interval_s=0.05)
    assert outcome.attempts == [submitted.attempt] and outcome.rows == 8
    assert rest.pending_items(SHARD).num_rows == 0
    assert len(admin.ledger()) == 8  # the batch was sent and billed once


def test_a_batch_collection_that_lost_its_lease_during_the_download_writes_no_collected_record(
    admin, tmp_path, monkeypatch
):
    spec, store = make_job(tmp_path, BATCH)
    executor = create_executor(spec.backend)
    download = executor.fetch
    taker = []

    def stalling_fetch(handle):  # the provider's download, then a stall past the ttl before the runner goes on
        yield from download(handle)
        taker.append(take_over(store))

    executor.fetch = stalling_fetch
    runner = ShardRunner(spec, store, executor, None)
    submitted = runner.submit(SHARD)
    with pytest.raises(StaleAttemptError, match="refusing to mark the attempt collected"):
        runner.collect(SHARD, poll_interval_s=0.05)
    assert taker
    assert parts(store, submitted.attempt)  # written while the lease was still its own
    assert "collected" not in AttemptLog(store, JOB, SHARD).events(submitted.attempt)

    rest = finisher(spec, store, taker[0])
    assert rest.collect(SHARD, poll_interval_s=0.05).attempts == [submitted.attempt]
    assert "collected" in AttemptLog(store, JOB, SHARD).events(submitted.attempt)
    assert rest.pending_items(SHARD).num_rows == 0 and len(admin.ledger()) == 8


def test_a_stream_that_lost_its_lease_while_the_engine_stalled_writes_no_further_part(admin, tmp_path, monkeypatch):
    spec, store = make_job(tmp_path, STREAM)
    executor = create_executor(spec.backend)
    engine = executor.run
    taker = []
    flushed: list[int] = []

    def stalling_run(work):  # the engine stalls past the ttl before yielding its second table
        inner = engine(work)
        try:
            for i, table in enumerate(inner):
                if i == 1:
                    # meanwhile its worker answers every request (the event, not a hope that the stall is long
                    # enough): all 8 are paid for by the run that is about to lose its lease
                    deadline = time.monotonic() + 60
                    while len(admin.ledger()) < 8:
                        assert time.monotonic() < deadline, "the stalled run's worker did not answer every request"
                        time.sleep(0.02)
                    taker.append(take_over(store))
                yield table
        finally:
            inner.close()

    executor.run = stalling_run
    runner = ShardRunner(spec, store, executor, None, pricing="online")
    with pytest.raises(StaleAttemptError, match="refusing to write a result part"):
        runner.run_stream(SHARD, on_flush=lambda rows, total: flushed.append(rows))
    assert taker and flushed == [2]
    (attempt,) = AttemptLog(store, JOB, SHARD).all()
    landed = store.read_parts(f"{JobPaths(JOB).results}/{SHARD}")
    assert len(parts(store, attempt.number)) == 1 and landed.num_rows == 2  # only the part before the takeover
    assert attempt.open and "collected" not in attempt.records  # nor a record: the new holder closes it

    rest = finisher(spec, store, taker[0], pricing="online")
    outcome = rest.run_stream(SHARD)
    # every answer the stale run was paid for was in its journal: replayed into a part, not sent again
    assert outcome.attempts == [] and outcome.rows == 0
    events = AttemptLog(store, JOB, SHARD).events(attempt.number)
    assert "abandoned" in events and "collected" not in events
    assert rest.pending_items(SHARD).num_rows == 0
    billed = [e["request_key"] for e in admin.ledger()]
    assert len(billed) == len(set(billed)) == 8  # nothing paid twice
