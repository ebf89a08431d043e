"""Reconciliation: every item of the manifest is in exactly one state, per shard and per job.

``expected = valid + invalid + missing + dead_lettered``. States are derived from the store on every
call (attempts included), so they survive restarts. The invariant is checked from independent sets:
a result for an ID the manifest does not know, or an item counted twice, fails loudly.
"""

from dataclasses import dataclass

import polars as pl

from batch_pipeline.core.errors import ErrorClass, ReconciliationError

VALID = "valid"
INVALID = "invalid"
MISSING = "missing"
DEAD = "dead_lettered"
STATES = (VALID, INVALID, MISSING, DEAD)
NO_BUDGET_CODES = ("batch_expired", "batch_cancelled")  # the provider never tried the item


@dataclass
class Counts:
    expected: int
    valid: int
    invalid: int
    missing: int
    dead_lettered: int

    @property
    def balanced(self) -> bool:
        return self.expected == self.valid + self.invalid + self.missing + self.dead_lettered

    @property
    def retryable(self) -> int:
        return self.invalid + self.missing

    def as_dict(self) -> dict[str, int]:
        return {"expected": self.expected, "valid": self.valid, "invalid": self.invalid,
                "missing": self.missing, "dead_lettered": self.dead_lettered}


def item_states(items: pl.DataFrame, results: pl.DataFrame, per_item_budget: int) -> pl.DataFrame:
    """One row per manifest item: its state, failures spent and last error.

    ``items``: request_id, shard_id. ``results``: request_id, attempt, status, error_class, error_code,
    error_message (one row per request and attempt).
    """
    failed = (pl.col("status") != "succeeded") & (pl.col("error_class") != ErrorClass.SYSTEMIC.value) & \
        ~pl.col("error_code").fill_null("").is_in(NO_BUDGET_CODES)
    per_item = (
        results.sort("attempt")
        .group_by("request_id")
        .agg(
            (pl.col("status") == "succeeded").any().alias("_ok"),
            failed.sum().alias("failures"),
            pl.col("attempt").max().alias("attempts"),
            pl.col("status").last().alias("last_status"),
            pl.col("error_code").last().alias("last_error_code"),
            pl.col("error_message").last().alias("last_error"),
        )
    )
    joined = items.select("request_id", "shard_id").join(per_item, on="request_id", how="left")
    state = (
        pl.when(pl.col("_ok").fill_null(False)).then(pl.lit(VALID))
        .when(pl.col("failures").fill_null(0) >= per_item_budget).then(pl.lit(DEAD))
        .when(pl.col("last_status") == "invalid").then(pl.lit(INVALID))
        .otherwise(pl.lit(MISSING))
    )
    return joined.with_columns(state.alias("state"), pl.col("failures").fill_null(0),
                               pl.col("attempts").fill_null(0)).drop("_ok")


def counts_by_shard(states: pl.DataFrame) -> dict[str, Counts]:
    table = states.group_by("shard_id").agg(
        pl.len().alias("expected"), *[(pl.col("state") == s).sum().alias(s) for s in STATES])
    return {row["shard_id"]: Counts(row["expected"], row[VALID], row[INVALID], row[MISSING], row[DEAD])
            for row in table.iter_rows(named=True)}


def job_counts(per_shard: dict[str, Counts]) -> Counts:
    return Counts(*(sum(getattr(c, f) for c in per_shard.values())
                    for f in ("expected", "valid", "invalid", "missing", "dead_lettered")))


def check_invariant(items: pl.DataFrame, results: pl.DataFrame, states: pl.DataFrame) -> Counts:
    """Assert the accounting from independent sets; raise ``ReconciliationError`` naming the gap."""
    problems = []
    expected_ids = items.get_column("request_id")
    if expected_ids.n_unique() != items.height:
        problems.append(f"{items.height - expected_ids.n_unique()} request IDs appear in more than one shard")
    orphans = results.select("request_id").unique().join(items.select("request_id"), on="request_id", how="anti")
    if orphans.height:
        problems.append(f"{orphans.height} results for request IDs the manifest does not know "
                        f"(e.g. {orphans['request_id'][0]})")
    per_shard = counts_by_shard(states)
    total = job_counts(per_shard)
    if total.expected != items.height:
        problems.append(f"states cover {total.expected} items, manifest has {items.height}")
    for shard, c in per_shard.items():
        if not c.balanced:
            problems.append(f"shard {shard}: expected {c.expected} != {c.as_dict()}")
    valid_ids = results.filter(pl.col("status") == "succeeded").select("request_id").unique()
    if valid_ids.height != total.valid:
        problems.append(f"{valid_ids.height} items have a succeeded result but {total.valid} are counted valid")
    if problems:
        raise ReconciliationError("reconciliation failed: " + "; ".join(problems))
    return total
