"""The job-wide retry-spend cap: retries may cost at most ``retries.spend_cap_share`` of the first pass.

A retry is an attempt at an item that already failed for a reason of its own (an expired or cancelled
batch, or a systemic stop, never tried the item, so re-sending it is not a retry). When the spend on
retries so far plus the estimated cost of the next retry submission would pass the cap, the job stops
for inspection: a retry storm usually means a systematic problem that more money will not fix.
"""

from dataclasses import dataclass

import polars as pl

from batch_pipeline.core.ledger.reconcile import spends_budget


@dataclass
class RetrySpend:
    first_pass_cost: float  # estimated cost of one attempt at every item
    retry_cost: float  # spent on retries so far
    next_cost: float  # estimated cost of the retries about to be sent
    cap: float

    @property
    def exceeded(self) -> bool:
        return self.retry_cost + self.next_cost > self.cap + 1e-12

    def describe(self) -> str:
        return (
            f"retry spend would reach {self.retry_cost + self.next_cost:.6f} (spent {self.retry_cost:.6f} + next "
            f"{self.next_cost:.6f}), over the cap {self.cap:.6f} = share of the first pass "
            f"{self.first_pass_cost:.6f}"
        )


@dataclass(frozen=True)
class RetryCosts:
    """One shard's (or the job's) part of the cap: what first tries cost and how many there were, what retries
    cost and how many. Kept in each shard's summary, so the cap is checked without reading every result row.
    Measured in dollars when results carry a cost, else in requests (1 per request)."""

    first_cost: float = 0.0
    first_tries: int = 0
    retry_cost: float = 0.0
    retry_tries: int = 0

    def __add__(self, other: "RetryCosts") -> "RetryCosts":
        return RetryCosts(
            self.first_cost + other.first_cost,
            self.first_tries + other.first_tries,
            self.retry_cost + other.retry_cost,
            self.retry_tries + other.retry_tries,
        )

    def spend(self, total_items: int, retry_items: int, share: float) -> RetrySpend:
        priced = self.first_cost > 0
        first, retried = (
            (self.first_cost, self.retry_cost) if priced else (float(self.first_tries), float(self.retry_tries))
        )
        mean = first / self.first_tries if self.first_tries else 0.0
        first_pass = mean * total_items
        return RetrySpend(first_pass, retried, mean * retry_items, share * first_pass)


def retry_costs(results: pl.DataFrame) -> RetryCosts:
    """The cap's inputs over these results (one row per request and attempt, with ``cost_usd``)."""
    if results.height == 0:
        return RetryCosts()
    frame = results.select("request_id", "attempt", "cost_usd", spends_budget().cast(pl.Int32).alias("_burn"))
    if frame.get_column("request_id").n_unique() == frame.height:  # one try per request: each a first, none a retry
        return RetryCosts(float(frame.get_column("cost_usd").sum() or 0.0), frame.height)
    ordered = frame.sort("request_id", "attempt")
    ordered = ordered.with_columns(
        (pl.col("_burn").cum_sum().over("request_id") - pl.col("_burn")).alias("_burned_before"),
        (pl.col("attempt") == pl.col("attempt").min().over("request_id")).alias("_first"),
    )
    first = ordered.filter(pl.col("_first"))
    retries = ordered.filter(pl.col("_burned_before") > 0)
    return RetryCosts(
        float(first["cost_usd"].sum() or 0.0), first.height, float(retries["cost_usd"].sum() or 0.0), retries.height
    )
