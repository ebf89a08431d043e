"""Group the shards a plan moves into runs: one partition range per run, so 10,000 shards are not 10,000 runs.

A Dagster run over a range of dynamic partitions takes every partition between its ends (in the order they were
added), so a range here is a window of at most ``span`` partitions that starts at a shard that moves; inside it,
``shards`` says which ones move (the others keep their own steps and are left alone by the run's assets). The
driver decides what each shard needs (``next_steps``); this only packs the decision into runs.
"""

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ShardRange:
    start: str
    end: str
    shards: tuple[str, ...]  # the shards that move, in partition order (a subset of start..end)

    @property
    def single(self) -> bool:
        return len(self.shards) == 1

    def digest(self, tokens: Iterable[str] = ()) -> str:
        """A short fingerprint of the shards (and what each does): the run key of a range changes with them."""
        text = "\n".join([*self.shards, *tokens])
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def shard_ranges(order: Sequence[str], moving: Iterable[str], span: int) -> list[ShardRange]:
    """Windows over ``order`` (the partition order) of at most ``span`` partitions, each starting and ending at a
    shard of ``moving``; every moving shard that is in ``order`` is in exactly one window, ranges in order."""
    if span < 1:
        raise ValueError(f"span must be >= 1, got {span}")
    wanted = set(moving)
    out: list[ShardRange] = []
    current: list[str] = []
    first = 0
    for index, key in enumerate(order):
        if key not in wanted:
            continue
        if current and index - first >= span:
            out.append(ShardRange(current[0], current[-1], tuple(current)))
            current = []
        if not current:
            first = index
        current.append(key)
    if current:
        out.append(ShardRange(current[0], current[-1], tuple(current)))
    return out
