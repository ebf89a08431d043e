"""The driver's batch-minimum rule (Bedrock's records per job): what would be sent below it is never a batch."""

from batch_pipeline.core.state.driver import Action, CanaryStatus, JobFacts, Wait, WaitKind, next_steps, shard_step
from batch_pipeline.core.state.machine import ShardState
from batch_pipeline.core.state.summary import ShardSummary

PASSED = CanaryStatus("s00001", True, "passed", size=300)


def shard(shard_id: str, state: ShardState, expected: int, missing: int = 0) -> ShardSummary:
    return ShardSummary(shard_id, state, expected=expected, valid=expected - missing, missing=missing,
                        attempts=0 if state == ShardState.NEW else 1)


def test_a_shard_below_the_minimum_goes_to_the_tail_backend_and_says_why():
    step = shard_step(shard("s00002", ShardState.NEW, 40), JobFacts(canary=PASSED, min_batch=100, has_tail=True))
    assert step.action == Action.RESCUE
    assert step.reason == "40 item(s), below the backend's minimum of 100 per batch: the shard goes to the tail backend"


def test_without_a_tail_it_waits_with_the_reason_and_the_plan_shows_it():
    facts = JobFacts(canary=PASSED, min_batch=100)
    step = shard_step(shard("s00002", ShardState.NEW, 40), facts)
    assert isinstance(step, Wait) and step.kind == WaitKind.BELOW_MINIMUM
    plan = next_steps([shard("s00002", ShardState.NEW, 40), shard("s00003", ShardState.NEW, 150)], facts)
    assert plan.shards(Action.SUBMIT) == ["s00003"] and not plan.publish
    assert "below the backend's minimum of 100 per batch" in plan.waiting["s00002"]
    assert "1 shard(s) wait: 40 item(s), below the backend's minimum" in plan.describe()


def test_the_count_is_what_the_attempt_sends_new_items_or_retryable_ones():
    facts = JobFacts(canary=PASSED, min_batch=100, has_tail=True)
    assert shard_step(shard("s00002", ShardState.NEW, 100), facts).action == Action.SUBMIT  # the minimum itself
    # a big shard's few leftovers (retries) are below the minimum: online, not a tiny batch
    assert shard_step(shard("s00002", ShardState.COLLECTED, 500, missing=7), facts).action == Action.RESCUE
    assert shard_step(shard("s00002", ShardState.COLLECTED, 500, missing=120), facts).action == Action.SUBMIT
    # no minimum: the old rule
    assert shard_step(shard("s00002", ShardState.NEW, 1), JobFacts(canary=PASSED)).action == Action.SUBMIT


def test_a_canary_sample_below_the_minimum_runs_on_the_tail_or_waits():
    canary = CanaryStatus("s00001", size=50)
    s = shard("s00001", ShardState.NEW, 500)
    step = shard_step(s, JobFacts(canary=canary, min_batch=100, has_tail=True))
    assert step.action == Action.CANARY and step.tail and "50 item(s), below" in step.reason
    waits = shard_step(s, JobFacts(canary=canary, min_batch=100))
    assert isinstance(waits, Wait) and waits.kind == WaitKind.BELOW_MINIMUM
    big = shard_step(s, JobFacts(canary=CanaryStatus("s00001", size=300), min_batch=100))
    assert big.action == Action.CANARY and not big.tail


def test_open_batches_are_never_affected():
    s = ShardSummary("s00002", ShardState.INTENT, expected=5)
    assert shard_step(s, JobFacts(canary=PASSED, min_batch=100)).action == Action.RESOLVE
