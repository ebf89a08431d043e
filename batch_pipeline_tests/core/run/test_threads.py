"""ordered_map: input order kept, bounded look-ahead, errors raised in order, nothing left running."""

import os
import threading
import time

import pytest

from batch_pipeline.core.run.threads import ordered_map, usable_cores


def test_results_come_in_input_order_whatever_finishes_first():
    def slow_for_even(x: int) -> int:
        time.sleep(0.02 if x % 2 == 0 else 0.0)
        return x * x

    assert list(ordered_map(slow_for_even, range(20), workers=3)) == [x * x for x in range(20)]


def test_work_runs_on_several_threads_at_once():
    running = 0
    peak = 0
    lock = threading.Lock()

    def track(x: int) -> int:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.05)
        with lock:
            running -= 1
        return x

    assert list(ordered_map(track, range(8), workers=3)) == list(range(8))
    assert peak == 3


def test_items_are_read_lazily_with_bounded_look_ahead():
    pulled = []

    def items():
        for i in range(100):
            pulled.append(i)
            yield i

    results = ordered_map(lambda x: x, items(), workers=2, ahead=4)
    assert next(results) == 0
    assert len(pulled) == 4  # the first result is handed out once 4 items are in flight, not 100
    results.close()
    assert len(pulled) == 4


def test_an_error_in_the_work_is_raised_in_order_after_the_results_before_it():
    def fail_on_5(x: int) -> int:
        if x == 5:
            raise ValueError("item 5 is bad")
        return x

    got = []
    with pytest.raises(ValueError, match="item 5 is bad"):
        for r in ordered_map(fail_on_5, range(10), workers=2):
            got.append(r)
    assert got == [0, 1, 2, 3, 4]


def test_an_error_from_the_items_is_raised_and_work_in_flight_is_finished_first():
    started = threading.Semaphore(0)
    finished = []

    def items():
        yield from range(2)
        for _ in range(2):  # both items are being worked on when the download breaks
            assert started.acquire(timeout=5)
        raise ConnectionError("download broke")

    def work(x: int) -> int:
        started.release()
        time.sleep(0.1)
        finished.append(x)
        return x

    with pytest.raises(ConnectionError, match="download broke"):
        list(ordered_map(work, items(), workers=2, ahead=8))
    assert sorted(finished) == [0, 1]  # waited for, not left running behind the exception


def test_one_worker_is_a_plain_map_on_the_calling_thread():
    caller = threading.get_ident()
    assert list(ordered_map(lambda x: threading.get_ident() == caller, range(3), workers=1)) == [True] * 3


@pytest.mark.parametrize(
    ("cpu_max", "cap"), [("max 100000\n", None), ("150000 100000\n", 2), ("50000 100000\n", 1), ("garbage", None)]
)
def test_usable_cores_follow_a_cgroup_cpu_quota(tmp_path, cpu_max, cap):
    path = tmp_path / "cpu.max"
    path.write_text(cpu_max)
    affinity = len(os.sched_getaffinity(0))
    assert usable_cores(path) == (affinity if cap is None else min(affinity, cap))
    assert usable_cores(tmp_path / "missing") == affinity  # cgroup v1 or no cgroup: the affinity alone
