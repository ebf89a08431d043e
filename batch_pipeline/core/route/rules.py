"""The routing rule: a small table, not an if-chain.

Each candidate is described by what the rules need (``Candidate``: self-hosted or not, a provider batch or not, its
minimum and maximum requests per batch, its turnaround, its cost for this shard) and the shard by ``ShardFacts``.
The rules run in table order; each one excludes the candidates it cannot allow, and says why. Of the candidates
left, the cheapest wins. The choice's ``rule`` is the first rule that excluded a cheaper candidate (the reason the
cheapest was not taken), else ``cheapest``.

| rule             | excludes a candidate when                                                          |
|------------------|------------------------------------------------------------------------------------|
| governance       | ``data_may_leave: false`` and the candidate is not self-hosted                     |
| tiny_shard       | a provider batch, and the shard sends fewer than ``route.min_batch_items``         |
| provider_minimum | a provider batch, and the shard sends fewer than its minimum (Bedrock's records)   |
| provider_limit   | a provider batch, and the shard sends more than its maximum per batch              |
| deadline         | its turnaround (a batch's completion window) ends after the deadline               |
| queue_full       | its account queue is full, and the wait for room plus its window ends after the    |
|                  | deadline (without a deadline a full queue is waited for: it never loses the shard) |
| (then) cheapest  | the lowest estimated cost for the shard among the rest                             |
"""

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Candidate:
    backend: str
    model: str
    self_hosted: bool = False
    batch: bool = False  # a provider batch API (submit, then collect within its window)
    min_requests: int = 0  # per batch (0: none)
    max_requests: int | None = None  # per batch (None: no limit)
    turnaround_h: float = 0.0  # worst case until the results are in (a batch's completion window)
    cost_usd: float | None = None  # estimated for this shard (None: no price known)
    queue_wait_h: float = 0.0  # until its account queue surely has room for the shard (0: room now)

    @property
    def label(self) -> str:
        return f"{self.backend}/{self.model}"


@dataclass(frozen=True)
class ShardFacts:
    shard_id: str
    items: int  # what the shard's next attempt sends
    data_may_leave: bool = True
    min_batch_items: int = 0
    hours_to_deadline: float | None = None


def _queue_full(c: Candidate, f: ShardFacts) -> str | None:
    if f.hours_to_deadline is None or not c.queue_wait_h or c.queue_wait_h + c.turnaround_h <= f.hours_to_deadline:
        return None
    wait = "no room in sight" if c.queue_wait_h == float("inf") else f"room within {c.queue_wait_h:.1f} h"
    return (
        f"its queue is full ({wait}), and with its {c.turnaround_h:g} h window that ends after the deadline "
        f"{f.hours_to_deadline:.1f} h away"
    )


@dataclass(frozen=True)
class Rule:
    name: str
    excludes: Callable[[Candidate, ShardFacts], str | None]  # why the candidate is out, or None


RULES: tuple[Rule, ...] = (
    Rule(
        "governance", lambda c, f: None if f.data_may_leave or c.self_hosted else "data may not leave: self-hosted only"
    ),
    Rule(
        "tiny_shard",
        lambda c, f: (
            f"{f.items} item(s), below the route's minimum batch of {f.min_batch_items}"
            if c.batch and f.items < f.min_batch_items
            else None
        ),
    ),
    Rule(
        "provider_minimum",
        lambda c, f: (
            f"{f.items} item(s), below {c.backend}'s minimum of {c.min_requests} per batch"
            if c.batch and c.min_requests and f.items < c.min_requests
            else None
        ),
    ),
    Rule(
        "provider_limit",
        lambda c, f: (
            f"{f.items} item(s), above {c.backend}'s maximum of {c.max_requests} per batch"
            if c.batch and c.max_requests is not None and f.items > c.max_requests
            else None
        ),
    ),
    Rule(
        "deadline",
        lambda c, f: (
            f"the deadline is {f.hours_to_deadline:.1f} h away, {c.backend}'s window is {c.turnaround_h:g} h"
            if f.hours_to_deadline is not None and c.turnaround_h > f.hours_to_deadline
            else None
        ),
    ),
    Rule("queue_full", _queue_full),
)
CHEAPEST = "cheapest"


@dataclass(frozen=True)
class RouteChoice:
    shard_id: str
    backend: str | None  # None: no candidate can take the shard
    model: str | None
    rule: str  # the deciding rule (RULES' names, or "cheapest")
    reason: str
    excluded: dict[str, str] = field(default_factory=dict)  # candidate label -> why it is out
    costs: dict[str, float | None] = field(default_factory=dict)  # candidate label -> estimated cost

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "RouteChoice":
        """A stored choice (one written before ``excluded`` and ``costs`` were kept reads with them empty)."""
        return cls(**{"excluded": {}, "costs": {}, **d})


def _cost_key(c: Candidate) -> float:
    return float("inf") if c.cost_usd is None else c.cost_usd


def choose(candidates: Sequence[Candidate], facts: ShardFacts, rules: Sequence[Rule] = RULES) -> RouteChoice:
    """The candidate for this shard, the rule that decided and why (the table above)."""
    out: dict[str, tuple[str, str]] = {}  # label -> (rule, reason)
    for rule in rules:
        for c in candidates:
            if c.label not in out:
                why = rule.excludes(c, facts)
                if why is not None:
                    out[c.label] = (rule.name, why)
    costs = {c.label: c.cost_usd for c in candidates}
    excluded = {label: f"{rule}: {why}" for label, (rule, why) in out.items()}
    left = sorted((c for c in candidates if c.label not in out), key=_cost_key)
    if not left:
        return RouteChoice(
            facts.shard_id,
            None,
            None,
            "none",
            "no candidate can take the shard: " + "; ".join(f"{k} ({v})" for k, v in excluded.items()),
            excluded,
            costs,
        )
    pick = left[0]
    cheaper = [c for c in candidates if c.label in out and _cost_key(c) < _cost_key(pick)]
    order = [r.name for r in rules]
    if cheaper:
        first = min(cheaper, key=lambda c: (order.index(out[c.label][0]), _cost_key(c)))
        rule, why = out[first.label]
        reason = f"{rule}: {first.label} is out ({why}); {pick.label} is the cheapest of the rest"
    else:
        rule = CHEAPEST
        reason = f"cheapest of {len(left)} candidate(s)" + (
            f" at ${pick.cost_usd:.6f}" if pick.cost_usd is not None else ""
        )
    return RouteChoice(facts.shard_id, pick.backend, pick.model, rule, reason, excluded, costs)
