"""The work a quote prices: how many items are pending, per shard, and the sum of their token estimates.

Two ways to the same figures. ``PendingWork.from_totals`` (the job's own items, none given): from the totals the
manifest stores per shard when it is built (``Manifest.shard_totals``: its items and the sum of their
``est_input_tokens``), so a shard with nothing done is priced from two numbers, and only a shard with done items
(valid or dead-lettered) has its items read (request_id and est_input_tokens, a column read, never re-tokenized).
A manifest built before the totals were stored has them computed from its shard files (one column per shard).
``PendingWork.from_items``: from a frame of items the caller gives (a routed group of shards, a test's frame),
item by item, as the quote always did. Both give the same quote (``test_quote_totals`` compares every field).

The tokenizer's sample (``estimate.sample_shards``) and the calibration read what they need through the same
object: the pending rows of a few shard files, and the items of the shards that have results.
"""

from dataclasses import dataclass, field

import polars as pl

from batch_pipeline.core.ledger.reconcile import DEAD, VALID
from batch_pipeline.core.manifest.shards import Manifest

_ITEM_COLUMNS = ["request_id", "shard_id", "est_input_tokens"]


def done_items(states: pl.DataFrame | None) -> pl.DataFrame:
    """request_id (and shard_id, where the states carry it) of the items that need no more requests: valid or
    dead-lettered."""
    if states is None or not states.height:
        return pl.DataFrame(schema={"request_id": pl.String, "shard_id": pl.String})
    cols = [c for c in ("request_id", "shard_id") if c in states.columns]
    return states.filter(pl.col("state").is_in([VALID, DEAD])).select(cols)


@dataclass(frozen=True)
class QuoteBasis:
    """What a quote is made from. ``items``: the items to price (None: the job's own, from the manifest's per-shard
    totals); ``results``: their results so far (None: none); ``states``: the item states (None: nothing done; the
    states of some items only: the others are pending)."""

    items: pl.DataFrame | None = None
    results: pl.DataFrame | None = None
    states: pl.DataFrame | None = None

    def pricing(self, items: pl.DataFrame | None) -> "QuoteBasis":
        """The same results and states, pricing ``items`` (a routed group of shards)."""
        return QuoteBasis(items, self.results, self.states)


NOTHING_DONE = QuoteBasis()  # the job's own items, none answered yet


@dataclass
class PendingWork:
    """The items a quote prices and those of them still pending.

    ``requests`` and ``est_sum``: the pending items and the sum of their est_input_tokens; ``pending_by_shard``:
    each shard with pending items -> how many; ``shard_sizes``: each shard -> its items; ``items`` and
    ``items_est``: all the items priced (done or not) and their est_input_tokens sum (the cascade's mean row)."""

    manifest: Manifest
    requests: int
    est_sum: float
    pending_by_shard: dict[str, int]
    shard_sizes: dict[str, int]
    items: int
    items_est: int
    _frame: pl.DataFrame | None = None  # from_items: the items given (request_id, shard_id, est_input_tokens)
    _pending: pl.DataFrame | None = None  # from_items: the pending ones
    _done: pl.DataFrame = field(default_factory=lambda: done_items(None))  # from_totals: the done items
    _measured: pl.DataFrame | None = None  # from_totals: the items of the shards with results, once read

    @classmethod
    def from_items(cls, manifest: Manifest, items: pl.DataFrame, states: pl.DataFrame | None) -> "PendingWork":
        """Item by item, from ``items`` (request_id, shard_id, est_input_tokens) and the states of the done ones."""
        done = done_items(states)
        pending = items.join(done.select("request_id"), on="request_id", how="anti") if done.height else items
        n = pending.height
        by_shard = dict(sorted(pending.group_by("shard_id").len().iter_rows())) if n else {}
        sizes = dict(sorted(items.group_by("shard_id").len().iter_rows())) if items.height else {}
        return cls(
            manifest,
            requests=n,
            est_sum=float(est_total(pending)),
            pending_by_shard=by_shard,
            shard_sizes=sizes,
            items=items.height,
            items_est=est_total(items) if "est_input_tokens" in items.columns else 0,
            _frame=items,
            _pending=pending,
        )

    @classmethod
    def from_totals(cls, manifest: Manifest, states: pl.DataFrame | None) -> "PendingWork":
        """Every item of the job, from the manifest's per-shard totals; the items of a shard with done items are
        read (two columns of its file) to take the done ones out."""
        totals = manifest.shard_totals()
        done = done_items(states)
        if done.height and "shard_id" not in done.columns:  # states without their shards: find them
            index = pl.from_arrow(manifest.item_index(["request_id", "shard_id"]))
            assert isinstance(index, pl.DataFrame)
            done = done.join(index, on="request_id")
        pending = {sid: n for sid, (n, _) in totals.items()}
        est = {sid: e for sid, (_, e) in totals.items()}
        touched = sorted(set(done["shard_id"].unique().to_list()) & set(totals)) if done.height else []
        if touched:
            rows = pl.from_arrow(manifest.items_of(touched, _ITEM_COLUMNS))
            assert isinstance(rows, pl.DataFrame)
            left = rows.join(done.select("request_id"), on="request_id", how="anti")
            per_shard = {sid: (n, e) for sid, n, e in _per_shard(left).iter_rows()}
            for sid in touched:
                pending[sid], est[sid] = per_shard.get(sid, (0, 0))
        return cls(
            manifest,
            requests=sum(pending.values()),
            est_sum=float(sum(est.values())),
            pending_by_shard={sid: n for sid, n in pending.items() if n},
            shard_sizes={sid: n for sid, (n, _) in totals.items()},
            items=sum(n for n, _ in totals.values()),
            items_est=sum(e for _, e in totals.values()),
            _done=done,
        )

    def sample_source(self) -> tuple[list[str], pl.DataFrame | None, str]:
        """Where the tokenizer's sample is drawn from: (the shards, sorted; a frame of request IDs; "semi" or
        "anti"): the pending items, or every item when none is pending."""
        if self._frame is not None:
            source = self._pending if self.requests else self._frame
            assert source is not None
            return sorted(source["shard_id"].unique().to_list()), source.select("request_id"), "semi"
        shards = sorted(self.pending_by_shard) if self.requests else sorted(self.shard_sizes)
        return shards, (self._done.select("request_id") if self.requests and self._done.height else None), "anti"

    def measured_items(self, results: pl.DataFrame) -> pl.DataFrame:
        """request_id and est_input_tokens of the items the results may measure (``estimate.measured_ratio``):
        the items given, or the items of the shards that have results."""
        if self._frame is not None:
            return self._frame
        if self._measured is None:
            self._measured = measured_items(self.manifest, results)
        return self._measured


def measured_items(manifest: Manifest, results: pl.DataFrame) -> pl.DataFrame:
    """request_id and est_input_tokens of the items of the shards that ``results`` hold rows of (every item where
    the results carry no shard_id): what a calibration joins its measured results to."""
    if not results.height:
        return pl.DataFrame(schema={"request_id": pl.String, "est_input_tokens": pl.Int32})
    if "shard_id" in results.columns:
        known = set(manifest.shard_ids())
        shards = sorted(s for s in results["shard_id"].unique().to_list() if s in known)
        table = manifest.items_of(shards, ["request_id", "est_input_tokens"])
    else:
        table = manifest.item_index(["request_id", "est_input_tokens"])
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    return frame


def est_total(items: pl.DataFrame) -> int:
    """The sum of ``items``' est_input_tokens, in 64 bits (the column is 32-bit, and Polars sums it in its own type:
    past 2**31 tokens, a few tens of millions of items, it would wrap)."""
    return int(items["est_input_tokens"].cast(pl.Int64).sum() or 0)


def _per_shard(items: pl.DataFrame) -> pl.DataFrame:
    return items.group_by("shard_id").agg(pl.len(), pl.col("est_input_tokens").cast(pl.Int64).sum())
