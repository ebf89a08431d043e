"""The driver's rule table, one row at a time, on synthetic summaries (no store, no provider)."""

from batch_pipeline.core.ledger.attempts import SubmittedRecord
from batch_pipeline.core.ledger.machine import ShardState
from batch_pipeline.core.run.summary import OpenAttempt, ShardSummary
from batch_pipeline.core.state.driver import Action, CanaryStatus, JobFacts, Wait, WaitKind, next_steps, shard_step


def summary(
    shard: str, state: ShardState, *, retryable: int = 0, submitted: bool = False, canary_done: bool = False
) -> ShardSummary:
    opened = None
    if state in (ShardState.INTENT, ShardState.SUBMITTED):
        opened = OpenAttempt(
            1,
            f"j:{shard}:1",
            "openai_batch",
            "2026-12-01T00:00:00+00:00",
            False,
            SubmittedRecord(backend="openai_batch", batch_id="batch_1", key=f"j:{shard}:1")
            if submitted or state == ShardState.SUBMITTED
            else None,
        )
    valid = 10 - retryable
    return ShardSummary(
        shard_id=shard,
        state=state,
        expected=10,
        valid=valid,
        missing=retryable,
        attempts=0 if state == ShardState.NEW else 1,
        canary_done=canary_done,
        open=opened,
    )


PASSED = CanaryStatus("s00001", True, "passed")


def step_of(s: ShardSummary, **facts):
    return shard_step(s, JobFacts(**{"canary": PASSED, **facts}))


def test_new_and_retryable_shards_are_submitted_settled_ones_left_alone():
    plan = next_steps(
        [
            summary("s00001", ShardState.SETTLED),
            summary("s00002", ShardState.NEW),
            summary("s00003", ShardState.COLLECTED, retryable=3),
        ],
        JobFacts(canary=PASSED),
    )
    assert plan.shards(Action.SUBMIT) == ["s00002", "s00003"]
    assert not plan.publish


def test_nothing_else_moves_until_the_canary_has_passed():
    facts = JobFacts(canary=CanaryStatus("s00001"))
    plan = next_steps([summary("s00001", ShardState.NEW), summary("s00002", ShardState.NEW)], facts)
    assert [(s.action, s.shard_id) for s in plan.steps] == [(Action.CANARY, "s00001")]
    assert plan.waiting == {"s00002": "waits for the canary shard s00001"}
    # judged but not passed, then resumed by a human: it runs again, still alone
    again = next_steps(
        [summary("s00001", ShardState.COLLECTED, retryable=9, canary_done=True), summary("s00002", ShardState.NEW)],
        JobFacts(canary=CanaryStatus("s00001", False)),
    )
    assert again.shards(Action.CANARY) == ["s00001"] and again.shards(Action.SUBMIT) == []


def test_an_open_batch_waits_until_the_provider_ends_it_then_is_collected():
    s = summary("s00002", ShardState.SUBMITTED)
    assert step_of(s) == Wait(WaitKind.BATCH_OPEN, "batch open at the provider (batch_1)")
    assert step_of(s, ended=frozenset({"s00002"})).action == Action.COLLECT
    # a caller whose collect run waits on the batch itself (the CLI's passes) is told to collect it now
    inline = step_of(s, waits_inline=True)
    assert (inline.action, inline.reason) == (Action.COLLECT, "batch open at the provider (batch_1): wait on it")
    # but not while the shard's own run is in flight, nor after the deadline asks for a rescue
    assert step_of(s, waits_inline=True, in_flight=frozenset({"s00002"})).kind == WaitKind.IN_FLIGHT
    assert step_of(s, waits_inline=True, deadline_near=True, has_tail=True).action == Action.RESCUE


def test_an_orphaned_intent_is_resolved_not_waited_on():
    step = step_of(summary("s00002", ShardState.INTENT))
    assert step.action == Action.RESOLVE


def test_near_the_deadline_a_live_batch_is_rescued_and_new_work_goes_to_the_tail():
    near = {"deadline_near": True, "has_tail": True}
    assert step_of(summary("s00002", ShardState.SUBMITTED), **near).action == Action.RESCUE
    assert step_of(summary("s00003", ShardState.NEW), **near).action == Action.RESCUE
    # without a tail backend the deadline changes nothing
    assert step_of(summary("s00003", ShardState.NEW), deadline_near=True).action == Action.SUBMIT


def test_a_stale_quote_holds_submissions_and_asks_for_a_requote():
    plan = next_steps([summary("s00002", ShardState.NEW)], JobFacts(canary=PASSED, quote_fresh=False))
    assert plan.shards(Action.SUBMIT) == [] and plan.has(Action.REQUOTE)
    assert plan.waiting["s00002"] == "waits for a fresh quote"


def test_a_stopped_or_paused_job_plans_nothing_and_says_why():
    shards = [summary("s00002", ShardState.NEW), summary("s00003", ShardState.SUBMITTED)]
    stopped = next_steps(shards, JobFacts(canary=PASSED, stopped="bad key"))
    assert stopped.steps == [] and stopped.describe() == "job stopped: bad key"
    assert set(stopped.states.values()) == {ShardState.STOPPED}
    paused = next_steps(shards, JobFacts(canary=PASSED, paused=True))
    assert paused.steps == [] and set(paused.states.values()) == {ShardState.PAUSED}


def test_publish_only_when_every_shard_is_settled_and_nothing_is_in_flight():
    settled = [summary("s00001", ShardState.SETTLED), summary("s00002", ShardState.SETTLED)]
    assert next_steps(settled, JobFacts(canary=PASSED)).publish
    assert not next_steps(settled, JobFacts(canary=PASSED, busy=True)).publish
    assert not next_steps(
        [*settled, summary("s00003", ShardState.COLLECTED, retryable=1)], JobFacts(canary=PASSED)
    ).publish


def test_a_shard_with_a_run_in_flight_is_left_to_it():
    assert step_of(summary("s00002", ShardState.NEW), in_flight=frozenset({"s00002"})) == Wait(
        WaitKind.IN_FLIGHT, "a run of this shard is in flight"
    )
