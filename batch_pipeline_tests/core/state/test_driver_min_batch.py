"""The driver's batch-minimum rule (Bedrock's records per job): what would be sent below it is never a batch."""

from batch_pipeline.core.ledger.machine import ShardState
from batch_pipeline.core.run.summary import ShardSummary
from batch_pipeline.core.state.driver import Action, CanaryStatus, JobFacts, Wait, WaitKind, next_steps, shard_step

PASSED = CanaryStatus("s00001", True, "passed", size=300)


def shard(shard_id: str, state: ShardState, expected: int, missing: int = 0) -> ShardSummary:
    return ShardSummary(
        shard_id=shard_id,
        state=state,
        expected=expected,
        valid=expected - missing,
        missing=missing,
        attempts=0 if state == ShardState.NEW else 1,
    )


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
    s = ShardSummary(shard_id="s00002", state=ShardState.INTENT, expected=5)
    assert shard_step(s, JobFacts(canary=PASSED, min_batch=100)).action == Action.RESOLVE


def handed_over(n: int, of: int = 40) -> ShardSummary:
    """A collected shard whose primary gave ``n`` items up: they are the fallback's, and nothing else is left."""
    return ShardSummary(
        shard_id="s00002",
        state=ShardState.COLLECTED,
        expected=of,
        valid=of - n,
        missing=n,
        attempts=2,
        fallback_pending=n,
    )


def test_the_fallback_backends_own_minimum_holds_its_batch_back():
    # a Bedrock fallback (100 records per job) with 7 items handed over: never a batch of 7
    facts = JobFacts(canary=PASSED, min_batch=0, fallback_min_batch=100)
    step = shard_step(handed_over(7), facts)
    assert isinstance(step, Wait) and step.kind == WaitKind.BELOW_MINIMUM
    assert "7 item(s) the primary could not answer for the fallback model" in step.reason
    assert "below the fallback backend's minimum of 100 per batch" in step.reason
    # the primary's own minimum does not apply to the fallback's batch, nor the fallback's to the primary's
    assert shard_step(handed_over(7), JobFacts(canary=PASSED, min_batch=100)).fallback
    assert shard_step(shard("s00002", ShardState.NEW, 40), facts).action == Action.SUBMIT
    # at the minimum: a batch of its own
    assert shard_step(handed_over(100, of=500), facts).fallback and not shard_step(handed_over(100, of=500), facts).tail


def test_below_it_the_fallback_model_answers_on_the_tail_backend_when_there_is_one():
    facts = JobFacts(canary=PASSED, fallback_min_batch=100, has_tail=True, fallback_tail=True)
    step = shard_step(handed_over(7), facts)
    assert step.action == Action.SUBMIT and step.fallback and step.tail
    assert step.reason.endswith(
        "below the fallback backend's minimum of 100 per batch: to the fallback model on the tail backend"
    )
