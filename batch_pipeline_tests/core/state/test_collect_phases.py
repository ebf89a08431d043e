"""The driver collects several shards of one run at once: a batch still running does not hold up an ended one
behind it, reports come back in shard order, and one shard's systemic stop leaves the others collected.

The provider is the in-memory stand-in of ``test_runner`` (a test double of the provider, not of our code) with a
gate: a gated batch reports ``running`` until the test opens it.
"""

import threading

import pytest

from batch_pipeline.core.errors import SystemicError
from batch_pipeline.core.ledger.attempts import AttemptLog
from batch_pipeline.core.ledger.executor import BatchHandle, BatchState, BatchStatus
from batch_pipeline.core.manifest.shards import build_manifest
from batch_pipeline.core.run.runner import ShardRunner
from batch_pipeline.core.state.execute import ShardDriver, ShardReport
from batch_pipeline.core.store import Store
from batch_pipeline_tests.core.helpers import base_spec_dict, write_jsonl, write_spec
from batch_pipeline_tests.core.run.test_runner import PRICE, MemoryProvider, answer

SHARDS = ["s00001", "s00002", "s00003"]
DEADLINE_S = 120.0  # generous: the events below are waited on, never raced


class GatedProvider(MemoryProvider):
    """Batches of the shards in ``gated`` say ``running`` until ``opened`` is set; ``failed`` ones end failed."""

    poll_interval_s = 0.01

    def __init__(self, gated: set[str], failed: frozenset[str] = frozenset()):
        super().__init__(lambda prompt, n: answer())
        self.gated, self.failed = gated, failed
        self.opened = threading.Event()
        self.polled_gated = threading.Event()
        self.fetched: list[str] = []

    def poll(self, handle: BatchHandle) -> BatchStatus:
        shard = handle.key.split(":")[1]
        if shard in self.failed:
            return BatchStatus(BatchState.FAILED, "failed", errors=["the provider failed the batch"])
        if shard in self.gated and not self.opened.is_set():
            self.polled_gated.set()
            return BatchStatus(BatchState.RUNNING, "in_progress")
        return super().poll(handle)

    def fetch(self, handle: BatchHandle):
        self.fetched.append(handle.key.split(":")[1])
        yield from super().fetch(handle)


@pytest.fixture
def job(tmp_path):
    rows = [{"id": f"k{i}", "body": f"ticket {i}"} for i in range(12)]
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    spec = write_spec(tmp_path / "job", base_spec_dict(str(path), shards={"max_requests": 4}))
    store = Store(tmp_path / "store")
    assert build_manifest(spec, store).new_shards == SHARDS
    return spec, store


def submitted(job, provider) -> ShardDriver:
    spec, store = job
    runner = ShardRunner(spec, store, provider, PRICE)
    for shard in SHARDS:
        assert runner.submit(shard).handle is not None
    return ShardDriver(spec, store, runner)


def collected(store, spec, shard) -> bool:
    return any(a.number == 1 and not a.open for a in AttemptLog(store, spec.name, shard).all())


def test_an_ended_batch_is_collected_while_the_one_before_it_still_runs(job):
    spec, store = job
    provider = GatedProvider(gated={"s00001"})
    driver = submitted(job, provider)
    phases = driver.collect_phases(SHARDS, at_once=2)
    reports: list = []
    consumer = threading.Thread(target=lambda: reports.extend(phases), daemon=True)
    consumer.start()
    assert provider.polled_gated.wait(DEADLINE_S)
    # shard 1's batch still runs; shard 2's ended one is ingested and recorded meanwhile
    for _ in range(int(DEADLINE_S * 10)):
        if collected(store, spec, "s00002"):
            break
        threading.Event().wait(0.1)
    assert collected(store, spec, "s00002")
    assert not collected(store, spec, "s00001") and reports == []  # reports wait for shard 1: they come in order
    provider.opened.set()
    consumer.join(DEADLINE_S)
    assert not consumer.is_alive()
    assert [shard for shard, _ in reports] == SHARDS
    assert all(isinstance(r, ShardReport) and (r.results, r.succeeded, r.collected) == (4, 4, 1) for _, r in reports)
    assert provider.fetched.index("s00002") < provider.fetched.index("s00001")


def test_one_at_a_time_waits_for_the_first_batch_before_the_next(job):
    """The same run with ``at_once=1``: nothing behind the running batch moves (what the test above rules out)."""
    spec, store = job
    provider = GatedProvider(gated={"s00001"})
    driver = submitted(job, provider)
    reports: list = []
    consumer = threading.Thread(target=lambda: reports.extend(driver.collect_phases(SHARDS, at_once=1)), daemon=True)
    consumer.start()
    assert provider.polled_gated.wait(DEADLINE_S)
    provider.polled_gated.clear()
    assert provider.polled_gated.wait(DEADLINE_S)  # polled again: still waiting on shard 1, and only on it
    assert provider.fetched == [] and not collected(store, spec, "s00002")
    provider.opened.set()
    consumer.join(DEADLINE_S)
    assert provider.fetched == SHARDS and [shard for shard, _ in reports] == SHARDS


def test_a_failed_batch_is_handed_back_in_its_place_and_the_others_are_collected(job):
    spec, store = job
    provider = GatedProvider(gated=set(), failed=frozenset({"s00002"}))
    driver = submitted(job, provider)
    reports = list(driver.collect_phases(SHARDS, at_once=2))
    assert [shard for shard, _ in reports] == SHARDS
    failure = reports[1][1]
    assert isinstance(failure, SystemicError) and "s00002" in str(failure) and "failed at the provider" in str(failure)
    assert [r.results for _, r in (reports[0], reports[2])] == [4, 4]
    assert collected(store, spec, "s00001") and collected(store, spec, "s00003")
