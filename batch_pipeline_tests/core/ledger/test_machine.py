"""The state machine: every edge it has is allowed, every other move is refused naming both states."""

import pytest

from batch_pipeline.core.ledger.machine import (
    ATTEMPT_EVENTS,
    SHARD_TRANSITIONS,
    IllegalTransition,
    ShardState,
    check_attempt_event,
    check_shard_transition,
    check_summary_move,
)


@pytest.mark.parametrize("old", list(ShardState))
@pytest.mark.parametrize("new", list(ShardState))
def test_every_shard_move_is_allowed_exactly_when_the_table_has_it(old, new):
    if old == new or new in SHARD_TRANSITIONS[old]:
        check_shard_transition("s00001", old, new)
        return
    with pytest.raises(IllegalTransition, match=f"{old.value} -> {new.value}"):
        check_shard_transition("s00001", old, new)


def test_the_lifecycle_cannot_skip_the_intent():
    # the intent is what makes a crash between "the provider accepted" and "we recorded it" recoverable
    for new in (ShardState.SUBMITTED, ShardState.COLLECTED, ShardState.SETTLED, ShardState.ENDED):
        with pytest.raises(IllegalTransition):
            check_shard_transition("s1", ShardState.NEW, new)


def test_a_summary_one_record_behind_is_repaired_but_not_two_lifecycles():
    check_summary_move("s1", ShardState.NEW, ShardState.SUBMITTED)  # the intent's refresh was lost in a crash
    with pytest.raises(IllegalTransition, match="new -> ended"):
        check_summary_move("s1", ShardState.NEW, ShardState.ENDED)


def test_a_submitted_batch_is_never_abandoned():
    with pytest.raises(IllegalTransition, match="submitted -> abandoned.*cancel it first"):
        check_attempt_event("s1", 2, "submitted", "abandoned")
    check_attempt_event("s1", 2, "submitted", "collected")


@pytest.mark.parametrize("last", list(ATTEMPT_EVENTS))
def test_attempt_events_follow_their_order(last):
    for event in ("intent", "submitted", "collected", "abandoned"):
        if event in ATTEMPT_EVENTS[last]:
            check_attempt_event("s1", 1, last, event)
        else:
            with pytest.raises(IllegalTransition, match=f"{last or 'none'} -> {event}"):
                check_attempt_event("s1", 1, last, event)


def test_item_state_from_the_accounting():
    from batch_pipeline.core.ledger.machine import ItemState, item_state

    assert item_state("valid") == ItemState.SUCCEEDED
    assert item_state("valid", rescued=True) == ItemState.RESCUED
    assert item_state("missing") == ItemState.PENDING
    assert item_state("missing", in_open_attempt=True) == ItemState.SUBMITTED
    assert item_state("invalid", in_open_attempt=True) == ItemState.SUBMITTED
    assert item_state("dead_lettered", in_open_attempt=True) == ItemState.DEAD_LETTERED
