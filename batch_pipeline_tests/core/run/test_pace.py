"""The waits between a batch's polls (``core.run.pace``): the interval while the batch moves, longer while it
sits in one state, and what ``ShardRunner.collect`` actually waits between polls of a real store's attempt."""

import threading
import time

import pytest

from batch_pipeline.core.ledger.executor import BatchHandle, BatchState, BatchStatus
from batch_pipeline.core.run.pace import POLL_GROWTH, POLL_MAX_FACTOR, PollPace
from batch_pipeline.core.run.runner import ShardRunner
from batch_pipeline_tests.core.run.test_runner import PRICE, MemoryProvider, behaviour, job  # noqa: F401

V, R, F, C = BatchState.VALIDATING, BatchState.RUNNING, BatchState.FINALIZING, BatchState.COMPLETED


def test_the_wait_grows_while_the_state_holds_and_stops_at_the_cap():
    pace = PollPace(2.0)
    waits = [pace.after(R) for _ in range(12)]
    assert waits[0] == 2.0
    assert waits[1] == pytest.approx(2.0 * POLL_GROWTH)
    assert all(b >= a for a, b in zip(waits, waits[1:]))
    assert max(waits) == pytest.approx(2.0 * POLL_MAX_FACTOR)
    assert waits[-1] == waits[-2] == pytest.approx(2.0 * POLL_MAX_FACTOR)


def test_a_change_of_state_brings_the_wait_back_to_the_interval():
    pace = PollPace(1.0)
    for _ in range(8):
        pace.after(V)
    assert pace.after(R) == 1.0  # validating -> in progress: the next step may come soon
    for _ in range(8):
        pace.after(R)
    assert pace.after(F) == 1.0
    assert pace.after(F) == pytest.approx(POLL_GROWTH)


class ScriptedProvider(MemoryProvider):
    """A batch that goes through ``states`` one poll at a time, then stays completed."""

    def __init__(self, states: list[BatchState]):
        super().__init__(behaviour)
        self.states = list(states)
        self.polls = 0

    def poll(self, handle: BatchHandle) -> BatchStatus:
        state = self.states[min(self.polls, len(self.states) - 1)]
        self.polls += 1
        b = self.batches[handle.batch_id]
        return BatchStatus(state, state.value, total=b["n"], completed=0 if state != C else len(b["rows"]))


def test_collect_waits_longer_while_a_batch_stays_in_progress(job, monkeypatch):  # noqa: F811
    spec, store = job
    provider = ScriptedProvider([V] * 3 + [R] * 10 + [F] * 2 + [C])
    runner = ShardRunner(spec, store, provider, PRICE)
    runner.submit("s00001")
    main, waits, real_sleep = threading.current_thread(), [], time.sleep

    def recorded(seconds: float) -> None:  # the collecting thread's waits are recorded, not slept
        if threading.current_thread() is main:
            waits.append(seconds)
        else:
            real_sleep(seconds)

    monkeypatch.setattr(time, "sleep", recorded)
    out = runner.collect("s00001", poll_interval_s=0.5)
    assert out.rows == 9 and provider.polls == 16
    interval, cap = 0.5, 0.5 * POLL_MAX_FACTOR
    assert waits[:3] == pytest.approx([interval, interval * POLL_GROWTH, interval * POLL_GROWTH**2])  # validating
    in_progress = waits[3:13]
    assert in_progress[0] == interval  # a new state: back to the interval
    assert in_progress[-1] == pytest.approx(cap)  # ten unchanged polls: at the cap
    assert waits[13:15] == pytest.approx([interval, interval * POLL_GROWTH])  # finalizing
    assert len(waits) == 15  # no wait after the poll that found it completed
    # the same batch at a fixed interval would have been asked ~3x as often over the same time
    assert sum(waits) > 2 * interval * len(waits)
