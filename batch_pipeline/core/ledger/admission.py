"""Admission: does a batch fit in what its account's queue has free, whole, in part, or not yet.

The same rule answers the driver (which shards of a plan are sent now and which wait, ``Room``) and the runner
(how many of a shard's items its next attempt sends, ``fitting_prefix``), so the plan never promises what the
runner then refuses. A shard that does not fit whole is sent in part when the part is worth a batch: when the
shard is bigger than the whole cap (it could never go whole) or a quarter of the cap is free. The rest of its
items stay pending for its next attempt, so a shard bigger than the account's queue still finishes alone.
"""

from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from batch_pipeline.core.ledger.capacity_records import NOTHING, Dimension, Need, Snapshot

PARTIAL_SHARE = 0.25
SPLITTABLE = (Dimension.TOKENS, Dimension.REQUESTS)  # jobs and creates per hour are whole batches


class Verdict(StrEnum):
    FULL = "full"
    PARTIAL = "partial"
    WAIT = "wait"


def decide(snapshot: Snapshot, need: Need, taken: Need = NOTHING) -> tuple[Verdict, Dimension | None]:
    """Whether ``need`` fits beside what the snapshot holds plus ``taken`` (what the plan already admitted)."""
    partial = False
    for dim, limit in snapshot.limits.values.items():
        want = need.get(dim)
        if not want:
            continue
        free = max(limit - snapshot.in_use(dim) - taken.get(dim), 0)
        if want <= free:
            continue
        if dim in SPLITTABLE and free > 0 and (want > limit or free >= PARTIAL_SHARE * limit):
            partial = True
            continue
        return Verdict.WAIT, dim
    return (Verdict.PARTIAL if partial else Verdict.FULL), None


@dataclass
class Room:
    """The free capacity of the backend's account queues (one per account) as a plan hands it out, shard by shard,
    in shard order: a shard takes the first account it fits whole, else the first it fits in part."""

    snapshots: list[Snapshot]
    taken: list[Need] = field(default_factory=list)
    admitted: int = 0
    waiting: int = 0

    def __post_init__(self) -> None:
        self.taken = self.taken or [NOTHING for _ in self.snapshots]

    def fresh(self) -> "Room":
        return Room(self.snapshots)

    def admit(self, need: Need) -> str | None:
        """Take the shard's place (whole or the part that fits); the reason it waits when nothing fits."""
        partial: int | None = None
        blocked: list[Dimension | None] = []
        for i, snapshot in enumerate(self.snapshots):
            verdict, dim = decide(snapshot, need, self.taken[i])
            if verdict == Verdict.FULL:
                self.taken[i] = self.taken[i] + need
                self.admitted += 1
                return None
            if verdict == Verdict.PARTIAL and partial is None:
                partial = i
            blocked.append(dim)
        if partial is not None:  # the part that fits fills the splittable dimensions of that account
            snap, taken = self.snapshots[partial], self.taken[partial]
            fill = {d: max(snap.limits.values.get(d, 0) - snap.in_use(d), 0) for d in SPLITTABLE}
            self.taken[partial] = Need(
                max(taken.tokens, fill[Dimension.TOKENS]) if need.tokens else taken.tokens,
                max(taken.requests, fill[Dimension.REQUESTS]) if need.requests else taken.requests,
                taken.jobs + need.jobs,
            )
            self.admitted += 1
            return None
        self.waiting += 1
        return (
            "quota: "
            + "; ".join(snap.describe(dim) for snap, dim in zip(self.snapshots, blocked, strict=True))
            + "; sent when a batch ends and frees room"
        )


def fitting_prefix(snapshot: Snapshot, tokens: np.ndarray) -> int:
    """How many of the items (in order, with these per-item token needs) one batch may take now: all of them,
    the longest prefix that fits (``decide`` said partial), or 0 (wait)."""
    n = len(tokens)
    need = Need(int(tokens.sum()), n, 1)
    verdict, _ = decide(snapshot, need)
    if verdict == Verdict.FULL:
        return n
    if verdict == Verdict.WAIT:
        return 0
    limit = n
    free_tokens = snapshot.free(Dimension.TOKENS)
    if free_tokens is not None:
        limit = min(limit, int(np.searchsorted(np.cumsum(tokens), free_tokens, side="right")))
    free_requests = snapshot.free(Dimension.REQUESTS)
    if free_requests is not None:
        limit = min(limit, free_requests)
    return limit
