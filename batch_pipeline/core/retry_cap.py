"""The job-wide retry-spend cap: retries may cost at most ``retries.spend_cap_share`` of the first pass.

A retry is an attempt at an item that already failed for a reason of its own (an expired or cancelled
batch, or a systemic stop, never tried the item, so re-sending it is not a retry). When the spend on
retries so far plus the estimated cost of the next retry submission would pass the cap, the job stops
for inspection: a retry storm usually means a systematic problem that more money will not fix.
"""

from dataclasses import dataclass

import polars as pl

from batch_pipeline.core.reconcile import spends_budget


@dataclass
class RetrySpend:
    first_pass_cost: float   # estimated cost of one attempt at every item
    retry_cost: float        # spent on retries so far
    next_cost: float         # estimated cost of the retries about to be sent
    cap: float

    @property
    def exceeded(self) -> bool:
        return self.retry_cost + self.next_cost > self.cap + 1e-12

    def describe(self) -> str:
        return (f"retry spend would reach {self.retry_cost + self.next_cost:.6f} (spent {self.retry_cost:.6f} + next "
                f"{self.next_cost:.6f}), over the cap {self.cap:.6f} = share of the first pass "
                f"{self.first_pass_cost:.6f}")


def retry_spend(results: pl.DataFrame, total_items: int, retry_items: int, share: float) -> RetrySpend:
    """Measure in dollars when rows carry cost, else in requests (cost 1 per request)."""
    if results.height == 0:
        return RetrySpend(0.0, 0.0, 0.0, 0.0)
    priced = float(results["cost_usd"].sum() or 0.0) > 0
    unit = pl.col("cost_usd") if priced else pl.lit(1.0)
    ordered = results.sort("request_id", "attempt").with_columns(
        spends_budget().cast(pl.Int32).alias("_burn"), unit.alias("_cost"))
    ordered = ordered.with_columns(
        (pl.col("_burn").cum_sum().over("request_id") - pl.col("_burn")).alias("_burned_before"),
        (pl.col("attempt") == pl.col("attempt").min().over("request_id")).alias("_first"))
    first = ordered.filter(pl.col("_first"))
    mean = float(first["_cost"].mean() or 0.0)
    retry_cost = float(ordered.filter(pl.col("_burned_before") > 0)["_cost"].sum() or 0.0)
    first_pass = mean * total_items
    return RetrySpend(first_pass, retry_cost, mean * retry_items, share * first_pass)
