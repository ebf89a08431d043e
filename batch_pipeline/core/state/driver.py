"""The one driver: from per-shard summaries and a few job facts, the plan of what happens next.

``next_steps`` is the only place that decides: the CLI pass loop, both sensors and the shard assets execute
its plan (or ``shard_step`` for one shard) and never re-derive it. The rules, in order, for one shard:

| the job / the shard                               | step        | or it waits because            |
|---------------------------------------------------|-------------|--------------------------------|
| job stopped                                       | -           | the stop reason                |
| job paused                                        | -           | paused                         |
| a run of this shard is in flight                  | -           | run in flight                  |
| settled                                           | -           | (nothing left)                 |
| submitted, deadline near, tail configured         | RESCUE      |                                |
| submitted, the provider ended the batch           | COLLECT     |                                |
| submitted, the caller waits on batches inline     | COLLECT     |                                |
| submitted                                         | -           | batch open at the provider     |
| intent without a submission                       | RESOLVE     |                                |
| canary pending, this is the canary shard          | CANARY      |                                |
| canary pending, any other shard                   | -           | waits for the canary           |
| only items handed to the fallback are left        | SUBMIT (fb) | below the fallback's minimum   |
| new or retryable, deadline near, tail configured  | RESCUE      |                                |
| new or retryable, quote stale                     | REQUOTE     | waits for a fresh quote        |
| new or retryable, fewer than the backend's minimum| RESCUE      | below the minimum (no tail)    |
| new or retryable                                  | SUBMIT      |                                |

The minimum (``JobFacts.min_batch``, e.g. Bedrock's records per job) applies to what the step would send: the
shard's pending items, or the canary sample. Below it nothing is submitted as a batch: with a tail backend the
items go there (the canary too, ``Step.tail``), without one the shard waits and says why.

The fallback (``fallback:``, core/ledger/fallback.py) answers the items the primary gave up on once the primary has
nothing left to send in the shard (``Step.fallback``); the primary's rules (rescue, minimum) count only the
primary's own pending items. The fallback's backend has its own minimum (``JobFacts.fallback_min_batch``, e.g. a
Bedrock fallback's records per job): below it the items go to the tail backend with the fallback model
(``Step.tail``, when the tail's rows can be told from the primary's: another model), else the shard waits and says
why.

When every shard is settled and nothing is in flight, the plan is PUBLISH.
"""

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from batch_pipeline.core.ledger.admission import Room
from batch_pipeline.core.ledger.capacity import Need
from batch_pipeline.core.ledger.machine import ShardState
from batch_pipeline.core.run.summary import ShardSummary


class Action(StrEnum):
    CANARY = "canary"  # run the canary sample of the first shard, alone
    SUBMIT = "submit"  # new or retryable items: a new attempt
    RESOLVE = "resolve"  # an intent with no submission: find() at the provider, else close it and resubmit
    COLLECT = "collect"  # the provider ended the batch: ingest it (and judge the canary)
    RESCUE = "rescue"  # deadline near: cancel the live batch, keep its results, the rest online
    REQUOTE = "requote"  # the quote expired: price the remaining work again before spending
    PUBLISH = "publish"  # every item settled: stage, check, promote


class WaitKind(StrEnum):
    STOPPED = "stopped"
    PAUSED = "paused"
    IN_FLIGHT = "in_flight"  # a run of this shard is queued or running
    BATCH_OPEN = "batch_open"  # the provider is still working on the shard's batch
    CANARY = "canary"  # nothing but the canary moves until it has passed
    QUOTE = "quote"  # the quote expired: re-quote before spending
    BELOW_MINIMUM = "below_minimum"  # fewer items than a batch of the backend needs, and no tail backend
    QUOTA = "quota"  # the account's queue has no room for the shard's batch now (core/ledger)


@dataclass(frozen=True)
class Wait:
    kind: WaitKind
    reason: str


@dataclass(frozen=True)
class Step:
    action: Action
    shard_id: str | None
    reason: str
    tail: bool = False  # a CANARY (or a fallback SUBMIT) that runs on the tail backend (below the batch minimum)
    fallback: bool = False  # a SUBMIT of the items handed to the fallback model


@dataclass(frozen=True)
class CanaryStatus:
    shard_id: str | None  # None: the job has no canary (canary_first off, or no shards)
    verdict: bool | None = None  # None: not judged yet
    reason: str = ""
    size: int = 0  # canary.size: the sample sends at most this many items

    @property
    def pending(self) -> bool:
        """Not passed yet: not judged, or failed and resumed by a human (the canary then runs again)."""
        return self.shard_id is not None and self.verdict is not True


@dataclass(frozen=True)
class JobFacts:
    """What the driver needs beyond the summaries; each caller fills it from the store (and Dagster's runs)."""

    canary: CanaryStatus = CanaryStatus(None)
    stopped: str | None = None
    paused: bool = False
    quote_fresh: bool = True
    deadline_near: bool = False
    has_tail: bool = False
    in_flight: frozenset[str] = frozenset()  # shards with a queued or running run
    ended: frozenset[str] = frozenset()  # submitted shards whose batch the provider has ended
    busy: bool = False  # any run of the job in flight (holds publishing back)
    min_batch: int = 0  # items a batch of the backend needs at least (0: no minimum)
    fallback_min_batch: int = 0  # the same of the fallback's backend
    fallback_tail: bool = False  # the tail backend may answer with the fallback model (another model)
    room: Room | None = None  # the account queue's free capacity (None: the backend has none)
    needs: dict[str, Need] = field(default_factory=dict)  # what each shard's next batch would hold in the queue
    held: dict[str, str] = field(default_factory=dict)  # shards held for a human (results lost at the provider)
    waits_inline: bool = False  # the caller's collect run waits on an open batch itself (the CLI's passes)


@dataclass
class Plan:
    steps: list[Step] = field(default_factory=list)
    waiting: dict[str, str] = field(default_factory=dict)
    stopped: str | None = None
    paused: bool = False
    states: dict[str, ShardState] = field(default_factory=dict)
    wait_kinds: dict[str, WaitKind] = field(default_factory=dict)

    def waiting_for(self, kind: WaitKind) -> list[str]:
        return [s for s, k in self.wait_kinds.items() if k == kind]

    def shards(self, *actions: Action) -> list[str]:
        return [s.shard_id for s in self.steps if s.action in actions and s.shard_id is not None]

    def has(self, action: Action) -> bool:
        return any(s.action == action for s in self.steps)

    @property
    def publish(self) -> bool:
        return self.has(Action.PUBLISH)

    def describe(self) -> str:
        """One line: what happens next, or why nothing does."""
        if self.stopped:
            return f"job stopped: {self.stopped}"
        if self.paused:
            return "job paused: `batch-pipeline resume` continues it"
        parts = []
        for action in Action:
            n = sum(1 for s in self.steps if s.action == action)
            if n:
                parts.append(f"{action.value} {n}" if action not in (Action.PUBLISH, Action.REQUOTE) else action.value)
        reasons: dict[str, int] = {}
        for why in self.waiting.values():
            reasons[why] = reasons.get(why, 0) + 1
        waits = [f"{n} shard(s) wait: {why}" for why, n in sorted(reasons.items(), key=lambda kv: -kv[1])]
        return "; ".join(parts + waits[:3]) or "nothing to do"


def shard_step(s: ShardSummary, facts: JobFacts) -> Step | Wait | None:
    """The step for one shard, why it waits, or None when it is settled."""
    if facts.stopped:
        return Wait(WaitKind.STOPPED, f"job stopped: {facts.stopped}")
    if facts.paused:
        return Wait(WaitKind.PAUSED, "job paused")
    if s.shard_id in facts.in_flight:
        return Wait(WaitKind.IN_FLIGHT, "a run of this shard is in flight")
    if s.state == ShardState.SETTLED:
        if facts.canary.shard_id == s.shard_id and facts.canary.verdict is None and not facts.stopped:
            # collected, then killed before the verdict: nothing is sent; the step judges what is stored
            return Step(Action.CANARY, s.shard_id, "the canary was collected but never judged: judge it")
        return None
    if s.shard_id in facts.held:
        return Wait(WaitKind.STOPPED, f"shard held: {facts.held[s.shard_id]}")
    rescue = facts.deadline_near and facts.has_tail
    if s.state in (ShardState.SUBMITTED, ShardState.ENDED):
        if rescue:
            return Step(Action.RESCUE, s.shard_id, "deadline near: cancel the batch, keep its results, rest online")
        if s.state == ShardState.ENDED or s.shard_id in facts.ended:
            return Step(Action.COLLECT, s.shard_id, "the provider ended the batch")
        batch = s.open.submitted.batch_id if s.open and s.open.submitted else None
        if facts.waits_inline:
            return Step(
                Action.COLLECT, s.shard_id, f"batch open at the provider{f' ({batch})' if batch else ''}: wait on it"
            )
        return Wait(WaitKind.BATCH_OPEN, f"batch open at the provider{f' ({batch})' if batch else ''}")
    if s.state == ShardState.INTENT:
        return Step(
            Action.RESOLVE,
            s.shard_id,
            "an intent with no recorded submission: ask the provider, else close it and resubmit",
        )
    if facts.canary.pending:
        return _canary_step(s, facts)
    if s.fallback_pending and _pending(s) <= s.fallback_pending:
        return _fallback_step(s, facts)
    if rescue:
        return Step(Action.RESCUE, s.shard_id, "deadline near: the shard goes to the tail backend")
    if not facts.quote_fresh:
        return Wait(WaitKind.QUOTE, "waits for a fresh quote")
    small = _below_minimum(_pending(s) - s.fallback_pending, facts.min_batch)
    if small is not None:
        return (
            Step(Action.RESCUE, s.shard_id, f"{small}: the shard goes to the tail backend")
            if facts.has_tail
            else Wait(WaitKind.BELOW_MINIMUM, f"{small}{_NO_TAIL}")
        )
    what = "new" if s.state == ShardState.NEW else f"{s.retryable - s.fallback_pending} retryable item(s)"
    return Step(Action.SUBMIT, s.shard_id, what)


def _canary_step(s: ShardSummary, facts: JobFacts) -> Step | Wait:
    """While the canary is pending: the canary shard runs its sample alone; every other shard waits for it."""
    canary = facts.canary
    if s.shard_id != canary.shard_id:
        return Wait(WaitKind.CANARY, f"waits for the canary shard {canary.shard_id}")
    if not facts.quote_fresh:
        return Wait(WaitKind.QUOTE, "waits for a fresh quote")
    why = (
        "the canary runs first, alone"
        if not s.canary_done
        else "the canary has no verdict yet: it runs again (what is still pending in its sample)"
    )
    small = _below_minimum(min(canary.size or s.expected, _pending(s)), facts.min_batch)
    if small is None:
        return Step(Action.CANARY, s.shard_id, why)
    return (
        Step(Action.CANARY, s.shard_id, f"{why}; {small}: on the tail backend", tail=True)
        if facts.has_tail
        else Wait(WaitKind.BELOW_MINIMUM, f"the canary sample has {small}{_NO_TAIL}")
    )


def _fallback_step(s: ShardSummary, facts: JobFacts) -> Step | Wait:
    """Only items the primary gave up on are left: they go to the fallback model (or its tail), or wait."""
    if not facts.quote_fresh:
        return Wait(WaitKind.QUOTE, "waits for a fresh quote")
    what = f"{s.fallback_pending} item(s) the primary could not answer"
    small = _below_minimum(s.fallback_pending, facts.fallback_min_batch, "the fallback backend's")
    if small is None:
        return Step(Action.SUBMIT, s.shard_id, f"{what}: to the fallback model", fallback=True)
    if facts.fallback_tail:
        return Step(
            Action.SUBMIT,
            s.shard_id,
            f"{what}: {small}: to the fallback model on the tail backend",
            fallback=True,
            tail=True,
        )
    return Wait(
        WaitKind.BELOW_MINIMUM,
        f"{what} for the fallback model: {small}; they wait (a `tail:` backend "
        "with a price for the fallback model answers them online; or a fallback "
        "backend without a minimum)",
    )


_NO_TAIL = (
    "; it waits (a `tail:` backend in the spec sends such shards online; or lower the backend's minimum "
    "if the account's quota allows)"
)


def _pending(s: ShardSummary) -> int:
    """The items a new attempt of the shard sends (golden probes, riding along, are not counted)."""
    return s.expected if s.state == ShardState.NEW else s.retryable


def _below_minimum(sending: int, minimum: int, whose: str = "the backend's") -> str | None:
    """Why ``sending`` items cannot be one batch of a backend whose minimum is ``minimum``, or None when they can."""
    if not minimum or sending >= minimum:
        return None
    return f"{sending} item(s), below {whose} minimum of {minimum} per batch"


def _canary_need(need: Need, size: int, s: ShardSummary) -> Need:
    """The canary sends a sample of the shard: its share of the shard's need."""
    pending = max(_pending(s), 1)
    share = min(size or pending, pending) / pending
    return Need(int(need.tokens * share), int(need.requests * share), need.jobs)


def next_steps(summaries: Iterable[ShardSummary], facts: JobFacts) -> Plan:
    plan = Plan(stopped=facts.stopped, paused=facts.paused)
    unsettled = 0
    quote_held = False
    room = facts.room.fresh() if facts.room is not None else None
    for s in summaries:
        plan.states[s.shard_id] = (
            ShardState.STOPPED
            if facts.stopped
            else ShardState.PAUSED
            if facts.paused and s.state != ShardState.SETTLED
            else s.state
        )
        if s.state != ShardState.SETTLED:
            unsettled += 1
        step = shard_step(s, facts)
        if (
            room is not None
            and isinstance(step, Step)
            and step.action in (Action.SUBMIT, Action.CANARY)
            and not step.tail
            and not step.fallback
            and s.shard_id in facts.needs
        ):
            why = room.admit(
                _canary_need(facts.needs[s.shard_id], facts.canary.size, s)
                if step.action == Action.CANARY
                else facts.needs[s.shard_id]
            )
            if why is not None:
                step = Wait(WaitKind.QUOTA, why)
        if isinstance(step, Step):
            plan.steps.append(step)
        elif isinstance(step, Wait):
            plan.waiting[s.shard_id] = step.reason
            plan.wait_kinds[s.shard_id] = step.kind
            quote_held = quote_held or step.kind == WaitKind.QUOTE
    if facts.stopped or facts.paused:
        return plan
    if quote_held:
        plan.steps.append(Step(Action.REQUOTE, None, "the quote expired or the work changed"))
    if plan.states and unsettled == 0 and not facts.busy and not facts.in_flight:
        plan.steps.append(Step(Action.PUBLISH, None, "every item is settled"))
    return plan
