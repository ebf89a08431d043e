"""The fallback model: which items it answers, and which of a shard's results are its.

An item is handed to the fallback (``fallback:`` in the spec) once the primary cannot answer it: its retry budget
is spent (it would be dead-lettered) or its last failure was a non-retryable model error (poison: the request is
rejected as sent, so resending it to the same model pays for nothing). A systemic failure spends no budget and
stops the job, so it never hands an item over. The fallback then has the same budgets of its own; an item it
cannot answer either is dead-lettered.

The primary's and the fallback's results live side by side in the shard's results; a row is the fallback's when
its (backend, model) is the fallback's. The item states gain a ``stage`` column (primary or fallback): the runner
of each stage sends only its own stage's pending items (``ShardRunner.stage``).
"""

from enum import StrEnum

import polars as pl

from batch_pipeline.core.errors import ErrorClass
from batch_pipeline.core.ledger.reconcile import DEAD, VALID, item_states
from batch_pipeline.core.spec.job import BackendSpec, JobSpec


class Stage(StrEnum):
    PRIMARY = "primary"
    FALLBACK = "fallback"


def fallback_backend(spec: JobSpec) -> BackendSpec | None:
    if spec.fallback is None:
        return None
    return spec.fallback.backend or spec.backend


def fallback_variant(spec: JobSpec) -> JobSpec:
    """The job as the fallback runs it: its model and backend, everything else the job's (the same request IDs,
    prompt, output contract and budgets)."""
    assert spec.fallback is not None
    return spec.model_copy(update={"model": spec.fallback.model, "backend": fallback_backend(spec)})


def fallback_may_use_tail(spec: JobSpec) -> bool:
    """The fallback's items below its backend's batch minimum may go to the tail backend with the fallback model:
    there is a tail, and its rows are told from the primary's tail rows by their model."""
    return spec.fallback is not None and spec.tail is not None and spec.fallback.model != spec.model


def fallback_tail_variant(spec: JobSpec) -> JobSpec:
    """The fallback as the tail backend runs it (below the fallback backend's batch minimum)."""
    assert spec.tail is not None
    return fallback_variant(spec).model_copy(update={"backend": spec.tail.backend})


def is_fallback_row(spec: JobSpec) -> pl.Expr:
    """Result rows answered (or failed) by the fallback: on its backend, or on the tail (``fallback_may_use_tail``)."""
    backend = fallback_backend(spec)
    if backend is None or spec.fallback is None:
        return pl.lit(False)
    names = [backend.name, *([spec.tail.backend.name] if fallback_may_use_tail(spec) and spec.tail else [])]
    return (pl.col("model") == spec.fallback.model) & pl.col("backend").is_in(names)


def handed_over(states: pl.DataFrame) -> pl.Series:
    """Items the primary gives up on: budget spent, or a non-retryable model error (never a systemic one)."""
    return (states["state"] == DEAD) | (
        (states["state"] != VALID) & (states["last_error_class"] == ErrorClass.POISON.value).fill_null(False)
    )


def staged_item_states(
    spec: JobSpec, items: pl.DataFrame, results: pl.DataFrame, replays: pl.DataFrame | None = None
) -> pl.DataFrame:
    """``reconcile.item_states`` with a ``stage`` column: the primary's states, and for the items handed over,
    the fallback's states over the fallback's rows only (its own budget). ``results`` need ``model`` and
    ``backend`` when the job has a fallback."""
    if spec.fallback is None or results.height == 0:
        return item_states(items, results, spec.retries, replays).with_columns(
            pl.lit(Stage.PRIMARY.value).alias("stage")
        )
    mine = results.select(is_fallback_row(spec)).to_series()
    primary = item_states(items, results.filter(~mine), spec.retries, replays)
    handed = handed_over(primary)
    if not handed.any():
        return primary.with_columns(pl.lit(Stage.PRIMARY.value).alias("stage"))
    moved = items.filter(pl.col("request_id").is_in(primary.filter(handed)["request_id"].implode()))
    second = item_states(moved, results.filter(mine), spec.retries, replays)
    # a replay gives the primary a fresh budget: its items start over at the primary
    out = primary.filter(~handed).with_columns(pl.lit(Stage.PRIMARY.value).alias("stage"))
    second = second.with_columns(pl.lit(Stage.FALLBACK.value).alias("stage")).select(out.columns)
    order = items.select("request_id").with_row_index("_order")
    return pl.concat([out, second]).join(order, on="request_id", how="left").sort("_order").drop("_order")
