"""The driver's quota rule (shards wait while the account's queue has no room, with the figures), a shard held
for a human, and a canary collected but never judged (a kill between the two)."""

from batch_pipeline.core.ledger.admission import Room
from batch_pipeline.core.ledger.capacity import CapacityScope, Dimension, Holding, Limits, Need, Snapshot
from batch_pipeline.core.ledger.machine import ShardState
from batch_pipeline.core.run.summary import ShardSummary
from batch_pipeline.core.state.driver import Action, CanaryStatus, JobFacts, WaitKind, next_steps, shard_step

PASSED = CanaryStatus("s00001", True, "passed", size=300)
SCOPE = CapacityScope("openai_batch", "OPENAI_API_KEY", "gpt-4o-mini")


def new(shard_id: str, n: int = 10) -> ShardSummary:
    return ShardSummary(shard_id=shard_id, state=ShardState.NEW, expected=n, missing=n)


def room(limit: int, used: int = 0) -> Room:
    from datetime import UTC, datetime

    held = (Holding(1, "embed", "s00009", 1, Need(used, 1), datetime.now(UTC), "batch_x"),) if used else ()
    return Room([Snapshot(SCOPE, Limits({Dimension.TOKENS: limit}, {Dimension.TOKENS: "configured"}), held)])


def test_shards_beyond_the_free_room_wait_with_the_figures_and_the_rest_are_sent():
    shards = [new(f"s0000{i}") for i in range(1, 6)]
    needs = {s.shard_id: Need(1000, 10) for s in shards}
    plan = next_steps(shards, JobFacts(canary=PASSED, room=room(4000, used=1500), needs=needs))
    assert plan.shards(Action.SUBMIT) == ["s00001", "s00002"]  # 2,500 free: two whole, then 500 (< a quarter)
    assert plan.waiting_for(WaitKind.QUOTA) == ["s00003", "s00004", "s00005"]
    why = plan.waiting["s00003"]
    assert why.startswith("quota: 1.5k of 4k enqueued tokens in use by 1 batch(es) (job embed)"), why
    assert "3 shard(s) wait: quota:" in plan.describe()
    again = next_steps(shards, JobFacts(canary=PASSED, room=room(4000, used=1500), needs=needs))
    assert again.shards(Action.SUBMIT) == plan.shards(Action.SUBMIT)  # a plan hands out a fresh room each time


def test_a_shard_bigger_than_the_cap_is_admitted_into_an_empty_queue():
    plan = next_steps([new("s00001", 100)], JobFacts(canary=PASSED, room=room(4000), needs={"s00001": Need(9000, 100)}))
    assert plan.shards(Action.SUBMIT) == ["s00001"]  # sent in parts that fit


def test_a_held_shard_waits_for_a_human_and_the_others_go_on():
    facts = JobFacts(canary=PASSED, held={"s00002": "results deleted by the provider"})
    plan = next_steps([new("s00001"), new("s00002")], facts)
    assert plan.shards(Action.SUBMIT) == ["s00001"]
    assert plan.wait_kinds["s00002"] == WaitKind.STOPPED and "deleted by the provider" in plan.waiting["s00002"]


def test_a_canary_collected_but_never_judged_is_judged_and_a_judged_one_is_left_alone():
    settled = ShardSummary(
        shard_id="s00001", state=ShardState.SETTLED, expected=10, valid=10, attempts=1, canary_done=True
    )
    step = shard_step(settled, JobFacts(canary=CanaryStatus("s00001", None, size=300)))
    assert step.action == Action.CANARY
    assert shard_step(settled, JobFacts(canary=PASSED)) is None
