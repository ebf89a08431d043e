"""Reconciliation: every item of the manifest is in exactly one state, per shard and per job.

``expected = valid + invalid + missing + dead_lettered``. States are derived from the store on every
call (attempts included), so they survive restarts. The invariant is checked from independent sets:
a result for an ID the manifest does not know, or an item counted twice, fails loudly.
"""

from dataclasses import dataclass
from enum import StrEnum

import polars as pl

from batch_pipeline.core.errors import ErrorClass, ReconciliationError


class Reconciled(StrEnum):
    """Where an item stands in the accounting (``expected = valid + invalid + missing + dead_lettered``); the state
    machine's ItemState is this plus whether an attempt is open (core/ledger/machine.py ``item_state``)."""

    VALID = "valid"
    INVALID = "invalid"
    MISSING = "missing"
    DEAD_LETTERED = "dead_lettered"


VALID, INVALID, MISSING, DEAD = (s.value for s in Reconciled)  # plain strings for Polars expressions
STATES = (VALID, INVALID, MISSING, DEAD)
RETRYABLE = (INVALID, MISSING)  # what a shard's next attempt sends again (the one place that says so)
NO_BUDGET_CODES = ("batch_expired", "batch_cancelled")  # the provider never tried the item


@dataclass
class Counts:
    """Items by reconciliation state, per shard or per job: every expected item is in exactly one of the four."""

    expected: int = 0
    valid: int = 0
    invalid: int = 0
    missing: int = 0
    dead_lettered: int = 0

    @property
    def balanced(self) -> bool:
        return self.expected == self.valid + self.invalid + self.missing + self.dead_lettered

    @property
    def retryable(self) -> int:
        return self.invalid + self.missing

    def as_dict(self) -> dict[str, int]:
        return {
            "expected": self.expected,
            "valid": self.valid,
            "invalid": self.invalid,
            "missing": self.missing,
            "dead_lettered": self.dead_lettered,
        }


@dataclass(frozen=True)
class Budget:
    """How many failures of each class an item may spend before it is dead-lettered."""

    per_item: int
    transient: int | None = None
    invalid_output: int | None = None
    poison: int | None = None

    @classmethod
    def of(cls, retries: "int | Budget | object") -> "Budget":
        """From a plain count (every class alike) or the spec's ``retries:`` (RetrySpec)."""
        if isinstance(retries, Budget):
            return retries
        if isinstance(retries, int):
            return cls(retries)
        return cls(retries.per_item, retries.transient, retries.invalid_output, retries.poison)  # type: ignore

    def dead(self) -> pl.Expr:
        failures = pl.col("failures").fill_null(0)
        poison, invalid = pl.col("_f_poison").fill_null(0), pl.col("_f_invalid").fill_null(0)
        expr = failures >= self.per_item
        if self.poison is not None:
            expr = expr | (poison >= self.poison)
        if self.invalid_output is not None:
            expr = expr | (invalid >= self.invalid_output)
        if self.transient is not None:
            expr = expr | ((failures - poison - invalid) >= self.transient)
        return expr


def _class_failures(error_class: ErrorClass) -> pl.Expr:
    return spends_budget() & (pl.col("error_class") == error_class.value)


def spends_budget() -> pl.Expr:
    """A failure that spends the item's budget (systemic failures and never-tried items do not)."""
    return (
        (pl.col("status") != "succeeded")
        & (pl.col("error_class") != ErrorClass.SYSTEMIC.value)
        & ~pl.col("error_code").fill_null("").is_in(NO_BUDGET_CODES)
    )


def _state(budget: Budget) -> pl.Expr:
    return (
        pl.when(pl.col("_ok").fill_null(False))
        .then(pl.lit(VALID))
        .when(budget.dead())
        .then(pl.lit(DEAD))
        .when(pl.col("last_status") == "invalid")
        .then(pl.lit(INVALID))
        .otherwise(pl.lit(MISSING))
    )


def _finish(joined: pl.DataFrame, budget: Budget) -> pl.DataFrame:
    return joined.with_columns(
        _state(budget).alias("state"), pl.col("failures").fill_null(0), pl.col("attempts").fill_null(0)
    ).drop("_ok", "_f_poison", "_f_invalid")


def _item_states_by_id(items: pl.DataFrame, results: pl.DataFrame, budget: Budget) -> pl.DataFrame:
    """The plain formulation: group and join on the request-ID strings."""
    per_item = (
        results.sort("attempt")
        .group_by("request_id")
        .agg(
            (pl.col("status") == "succeeded").any().alias("_ok"),
            spends_budget().sum().alias("failures"),
            _class_failures(ErrorClass.POISON).sum().alias("_f_poison"),
            _class_failures(ErrorClass.INVALID_OUTPUT).sum().alias("_f_invalid"),
            pl.col("attempt").max().alias("attempts"),
            pl.col("status").last().alias("last_status"),
            pl.col("error_code").last().alias("last_error_code"),
            pl.col("error_class").last().alias("last_error_class"),
            pl.col("error_message").last().alias("last_error"),
        )
    )
    joined = items.select("request_id", "shard_id").join(per_item, on="request_id", how="left", maintain_order="left")
    return _finish(joined, budget)


def item_states(
    items: pl.DataFrame, results: pl.DataFrame, retries: "int | Budget | object", replays: pl.DataFrame | None = None
) -> pl.DataFrame:
    """One row per manifest item (in the items' order): its state, failures spent and last error.

    ``items``: request_id, shard_id. ``results``: request_id, attempt, status, error_class, error_code,
    error_message (one row per request and attempt).

    Grouped and joined on a 64-bit hash of the request ID instead of the 64-character strings, with only
    numeric columns sorted and grouped; the strings of the last attempt are gathered once by row index. Two
    exact guards fall back to the plain formulation on a hash collision: rows of one key must carry one ID,
    and the ID of the group an item is joined to must be the item's.
    """
    budget = Budget.of(retries)
    if replays is not None and replays.height and results.height:
        results = without_replayed(results, replays)
    if results.height == 0 or items.height == 0:
        return _item_states_by_id(items, results, budget)
    rid = results.get_column("request_id")
    rows = results.select(
        pl.col("request_id").hash().alias("_k"),
        pl.col("attempt"),
        (pl.col("status") == "succeeded").alias("_ok"),
        spends_budget().cast(pl.UInt32).alias("_f"),
        _class_failures(ErrorClass.POISON).cast(pl.UInt32).alias("_fp"),
        _class_failures(ErrorClass.INVALID_OUTPUT).cast(pl.UInt32).alias("_fi"),
        pl.int_range(pl.len(), dtype=pl.UInt32).alias("_i"),
    ).sort("_k", "attempt")
    key, index = rows.get_column("_k"), rows.get_column("_i")
    repeat = (key == key.shift(1)).fill_null(False)
    if repeat.any():  # guard 1: every run of equal keys holds one request ID
        at = repeat.arg_true()
        if rid.gather(index.gather(at)).ne_missing(rid.gather(index.gather(at - 1))).any():
            return _item_states_by_id(items, results, budget)
    per_item = (
        rows.with_columns(pl.col("_k").set_sorted())
        .group_by("_k")
        .agg(
            pl.col("_ok").max(),
            pl.col("_f").sum().alias("failures"),
            pl.col("_fp").sum().alias("_f_poison"),
            pl.col("_fi").sum().alias("_f_invalid"),
            pl.col("attempt").last().alias("attempts"),
            pl.col("_i").last(),
        )
    )
    joined = items.select("request_id", "shard_id", pl.col("request_id").hash().alias("_k")).join(
        per_item, on="_k", how="left", maintain_order="left"
    )
    last = joined.get_column("_i")
    seen_id = rid.gather(last)
    if (last.is_not_null() & seen_id.ne_missing(joined.get_column("request_id"))).any():  # guard 2
        return _item_states_by_id(items, results, budget)
    tail = results.select(
        pl.col("status").alias("last_status"),
        pl.col("error_code").alias("last_error_code"),
        pl.col("error_class").alias("last_error_class"),
        pl.col("error_message").alias("last_error"),
    ).gather(last)
    joined = pl.concat(
        [joined.select("request_id", "shard_id", "_ok", "failures", "_f_poison", "_f_invalid", "attempts"), tail],
        how="horizontal",
    )
    return _finish(joined, budget)


def without_replayed(results: pl.DataFrame, replays: pl.DataFrame) -> pl.DataFrame:
    """Failures recorded before a replay no longer count: the replayed items start with a fresh budget.

    ``replays``: request_id, through_attempt (the item's last attempt when it was replayed). Successes are kept
    (a succeeded item is never dead, so it is never replayed)."""
    marks = replays.group_by("request_id").agg(pl.col("through_attempt").max())
    joined = results.join(marks, on="request_id", how="left")
    keep = (
        pl.col("through_attempt").is_null()
        | (pl.col("attempt") > pl.col("through_attempt"))
        | (pl.col("status") == "succeeded")
    )
    return joined.filter(keep).drop("through_attempt")


def counts_by_shard(states: pl.DataFrame) -> dict[str, Counts]:
    table = states.group_by("shard_id").agg(
        pl.len().alias("expected"), *[(pl.col("state") == s).sum().alias(s) for s in STATES]
    )
    return {
        row["shard_id"]: Counts(row["expected"], row[VALID], row[INVALID], row[MISSING], row[DEAD])
        for row in table.iter_rows(named=True)
    }


def job_counts(per_shard: dict[str, Counts]) -> Counts:
    return Counts(
        *(
            sum(getattr(c, f) for c in per_shard.values())
            for f in ("expected", "valid", "invalid", "missing", "dead_lettered")
        )
    )


def check_invariant(items: pl.DataFrame, results: pl.DataFrame, states: pl.DataFrame) -> Counts:
    """Assert the accounting from independent sets; raise ``ReconciliationError`` naming the gap."""
    problems = []
    expected_ids = items.get_column("request_id")
    # distinct hashes imply distinct IDs; count the strings only when the hashes say otherwise
    hashed_apart = expected_ids.hash().n_unique() == items.height
    duplicated = 0 if hashed_apart else items.height - expected_ids.n_unique()
    if duplicated:
        problems.append(f"{duplicated} request IDs appear in more than one shard")
    orphans = results.select("request_id").join(items.select("request_id"), on="request_id", how="anti")
    if orphans.height:
        orphans = orphans.unique(maintain_order=True)
        problems.append(
            f"{orphans.height} results for request IDs the manifest does not know (e.g. {orphans['request_id'][0]})"
        )
    per_shard = counts_by_shard(states)
    total = job_counts(per_shard)
    if total.expected != items.height:
        problems.append(f"states cover {total.expected} items, manifest has {items.height}")
    for shard, c in per_shard.items():
        if not c.balanced:
            problems.append(f"shard {shard}: expected {c.expected} != {c.as_dict()}")
    succeeded = results.filter(pl.col("status") == "succeeded").get_column("request_id")
    # with unique item IDs and no orphans, every succeeded ID is an item's, and item IDs hash apart
    valid_ids = succeeded.hash().n_unique() if hashed_apart and not orphans.height else succeeded.n_unique()
    if valid_ids != total.valid:
        problems.append(f"{valid_ids} items have a succeeded result but {total.valid} are counted valid")
    if problems:
        raise ReconciliationError("reconciliation failed: " + "; ".join(problems))
    return total
