"""When a full account queue will have room for a shard, at the latest: what the router weighs against a deadline.

A batch holds its place until it ends, and it ends by its completion window at the latest (``Ceilings.window``), so
the worst case is read off the ledger: the holdings in the order their windows close, released one by one, until
the shard fits (``admission.decide``: whole, or the part worth sending). Shards routed to the queue earlier in the
same plan wait first (``take``). The estimate is a bound, not a forecast: most batches end well inside their window.
"""

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from batch_pipeline.core.ledger.admission import Verdict, decide
from batch_pipeline.core.ledger.capacity_records import NOTHING, Need, Snapshot


@dataclass
class QueueClock:
    """The account queues (one snapshot per account) of one backend and model, as a routing plan fills them."""

    snapshots: list[Snapshot]
    window: timedelta
    taken: list[Need] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.taken = self.taken or [NOTHING for _ in self.snapshots]

    def _account_wait(self, i: int, need: Need, now: datetime) -> float:
        snap, taken = self.snapshots[i], self.taken[i]
        if decide(snap, need, taken)[0] != Verdict.WAIT:
            return 0.0
        closing = sorted(snap.holdings, key=lambda h: h.bound_at or h.at)
        for n, h in enumerate(closing):
            rest = Snapshot(snap.scope, snap.limits, tuple(closing[n + 1 :]), snap.created_last_hour)
            if decide(rest, need, taken)[0] != Verdict.WAIT:
                ends = (h.bound_at or h.at) + self.window
                return max((ends - now).total_seconds(), 0.0) / 3600
        return math.inf  # not even an empty queue takes it beside what the plan already sent there

    def hours_until_room(self, need: Need, now: datetime | None = None) -> float:
        """0 when some account has room now; else the hours until the earliest one surely has; inf: never."""
        now = now or datetime.now(UTC)
        return min((self._account_wait(i, need, now) for i in range(len(self.snapshots))), default=0.0)

    def take(self, need: Need, now: datetime | None = None) -> None:
        """The shard was routed here: it holds its place in the account that frees room first."""
        if not self.snapshots:
            return
        now = now or datetime.now(UTC)
        i = min(range(len(self.snapshots)), key=lambda k: self._account_wait(k, need, now))
        self.taken[i] = self.taken[i] + need
