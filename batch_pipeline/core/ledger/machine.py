"""Item and shard states, and the transitions between them: written once here, enforced where records are written.

A shard moves through its attempts: ``new -> intent -> submitted -> ended -> collected -> settled``. An intent
is written before every paid call; a stream shard goes from intent straight to collected. A collected shard with
retryable items starts its next attempt (``collected -> intent``); a replay reopens a settled one. ``paused`` and
``stopped`` overlay every live state while the job is paused or stopped.

Inside one attempt the events are ordered the same way (``intent`` first, then ``submitted``, then
``collected``); an attempt whose provider batch was submitted is never abandoned: it is collected (after a
cancel, when it is rescued), so its paid results are kept.
"""

from enum import StrEnum

from batch_pipeline.core.errors import BatchPipelineError


class ItemState(StrEnum):
    PENDING = "pending"  # never tried, or its last try left no result (expired, cancelled, lost)
    SUBMITTED = "submitted"  # in an open attempt
    SUCCEEDED = "succeeded"
    INVALID = "invalid"  # answered, but the answer broke the contract (retried within its budget)
    DEAD_LETTERED = "dead_lettered"  # budget spent; replayable
    RESCUED = "rescued"  # succeeded through the tail backend


class ShardState(StrEnum):
    NEW = "new"
    INTENT = "intent"
    SUBMITTED = "submitted"
    ENDED = "ended"
    COLLECTED = "collected"
    SETTLED = "settled"
    PAUSED = "paused"
    STOPPED = "stopped"

    @property
    def live(self) -> bool:
        """An attempt is open: something may be running or billed at the provider."""
        return self in (ShardState.INTENT, ShardState.SUBMITTED, ShardState.ENDED)


_S = ShardState
_LIFECYCLE: dict[ShardState, frozenset[ShardState]] = {
    _S.NEW: frozenset({_S.INTENT}),
    _S.INTENT: frozenset({_S.SUBMITTED, _S.COLLECTED, _S.SETTLED}),
    _S.SUBMITTED: frozenset({_S.ENDED, _S.COLLECTED, _S.SETTLED}),
    _S.ENDED: frozenset({_S.COLLECTED, _S.SETTLED}),
    _S.COLLECTED: frozenset({_S.INTENT, _S.SETTLED}),
    _S.SETTLED: frozenset({_S.INTENT, _S.COLLECTED}),  # a replay gives dead letters a fresh budget
}
_ACTIVE = (_S.NEW, _S.INTENT, _S.SUBMITTED, _S.ENDED, _S.COLLECTED, _S.SETTLED)
SHARD_TRANSITIONS: dict[ShardState, frozenset[ShardState]] = {
    **{s: to | {_S.PAUSED, _S.STOPPED} for s, to in _LIFECYCLE.items()},
    _S.PAUSED: frozenset({*_ACTIVE, _S.STOPPED}),
    _S.STOPPED: frozenset({*_ACTIVE, _S.PAUSED}),
}

# events of one attempt record (core/run attempts): what may follow what
ATTEMPT_EVENTS: dict[str | None, frozenset[str]] = {
    None: frozenset({"intent"}),
    "intent": frozenset({"submitted", "collected", "abandoned"}),
    "submitted": frozenset({"collected"}),
    "collected": frozenset({"discarded"}),  # the provider's copies deleted once the results were stored
    "abandoned": frozenset(),
    "discarded": frozenset(),
}


class IllegalTransition(BatchPipelineError):
    """A record would move a shard or an attempt along an edge the state machine does not have."""


def check_shard_transition(shard_id: str, old: ShardState, new: ShardState) -> None:
    if old != new and new not in SHARD_TRANSITIONS[old]:
        allowed = ", ".join(sorted(s.value for s in SHARD_TRANSITIONS[old]))
        raise IllegalTransition(
            f"shard {shard_id}: illegal transition {old.value} -> {new.value} (allowed from {old.value}: {allowed})"
        )


def check_summary_move(shard_id: str, old: ShardState, new: ShardState) -> None:
    """A stored summary may lag its attempt log by one record (a crash between the two): a move of at most two
    lifecycle edges is accepted; anything else is an illegal transition."""
    if old == new or new in SHARD_TRANSITIONS[old]:
        return
    if any(new in SHARD_TRANSITIONS[mid] for mid in _LIFECYCLE.get(old, ())):
        return
    check_shard_transition(shard_id, old, new)


def check_attempt_event(shard_id: str, attempt: int, last: str | None, event: str) -> None:
    allowed = ATTEMPT_EVENTS.get(last, frozenset())
    if event not in allowed:
        hint = (
            ": a submitted batch is collected (cancel it first to rescue its tail), never abandoned"
            if last == "submitted" and event == "abandoned"
            else ""
        )
        raise IllegalTransition(
            f"shard {shard_id} attempt {attempt}: illegal transition {last or 'none'} -> {event}{hint}"
        )


_RECONCILED_TO_ITEM = {
    "valid": ItemState.SUCCEEDED,
    "invalid": ItemState.INVALID,
    "missing": ItemState.PENDING,
    "dead_lettered": ItemState.DEAD_LETTERED,
}


def item_state(reconciled: str, *, in_open_attempt: bool = False, rescued: bool = False) -> ItemState:
    """An item's state from its accounting (``core/reconcile``), whether an open attempt holds it, and whether
    the tail backend answered it."""
    state = _RECONCILED_TO_ITEM[reconciled]
    if state == ItemState.SUCCEEDED and rescued:
        return ItemState.RESCUED
    if in_open_attempt and state in (ItemState.PENDING, ItemState.INVALID):
        return ItemState.SUBMITTED
    return state


def last_event(events: dict[str, object]) -> str | None:
    """The latest event an attempt has recorded (events are written in ATTEMPT_EVENTS order)."""
    for event in ("discarded", "collected", "abandoned", "submitted", "intent"):
        if event in events:
            return event
    return None
