"""The router's bound on a full queue's wait, read off a real capacity ledger on disk (core/ledger/queue_clock.py)."""

from datetime import UTC, datetime, timedelta

import pytest

from batch_pipeline.core.ledger.capacity import CapacityLedger, CapacityScope, Need
from batch_pipeline.core.ledger.queue_clock import QueueClock
from batch_pipeline.core.spec.quota import QuotaSpec
from batch_pipeline.core.store import Store

WINDOW = timedelta(hours=24)


@pytest.fixture
def ledger(tmp_path) -> CapacityLedger:
    return CapacityLedger(
        Store(str(tmp_path)),
        CapacityScope("openai_batch", "KEY", "gpt-4o-mini"),
        QuotaSpec(enqueued_tokens=1000, headroom=0.0),
    )


def test_room_now_is_no_wait(ledger):
    ledger.reserve("other", "s00001", 1, Need(400, 4, 1))
    assert QueueClock([ledger.snapshot()], WINDOW).hours_until_room(Need(500, 5, 1)) == 0.0


def test_a_full_queue_waits_until_enough_batches_are_past_their_window_and_the_plan_queues_behind(ledger):
    first = ledger.reserve("other", "s00001", 1, Need(400, 4, 1))
    second = ledger.reserve("other", "s00002", 1, Need(500, 5, 1))
    assert first is not None and second is not None
    now = first.at + timedelta(hours=2)
    clock = QueueClock([ledger.snapshot()], WINDOW)
    # 900 of 1000 held: a 300-token shard fits once the first batch ends, 22 h from now at the latest
    assert clock.hours_until_room(Need(300, 3, 1), now) == pytest.approx(22.0, abs=0.01)
    clock.take(Need(300, 3, 1), now)  # routed here: the next shard of the plan waits behind it
    assert clock.hours_until_room(Need(300, 3, 1), now) == pytest.approx(
        22.0 + (second.at - first.at) / timedelta(hours=1), abs=0.01
    )
    clock.take(Need(300, 3, 1), now)
    clock.take(Need(300, 3, 1), now)
    assert clock.hours_until_room(Need(300, 3, 1), now) == float("inf")  # 1200 > 1000 even in an empty queue


def test_several_accounts_take_the_one_that_frees_first(tmp_path):
    store = Store(str(tmp_path))
    a, b = (
        CapacityLedger(store, CapacityScope("openai_batch", k, "m"), QuotaSpec(enqueued_tokens=1000, headroom=0.0))
        for k in ("A", "B")
    )
    held_a = a.reserve("j", "s1", 1, Need(1000, 10, 1))
    assert held_a is not None
    clock = QueueClock([a.snapshot(), b.snapshot()], WINDOW)
    assert clock.hours_until_room(Need(800, 8, 1)) == 0.0  # B is empty
    clock.take(Need(800, 8, 1))
    now = datetime.now(UTC)
    assert 23.9 < clock.hours_until_room(Need(800, 8, 1), now) <= 24.0  # both full now: A's batch ends first
