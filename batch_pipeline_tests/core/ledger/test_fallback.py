"""The fallback's share of the item states and of the driver's plan (core/ledger/fallback.py, driver.py)."""

import polars as pl

from batch_pipeline.core.ledger.fallback import Stage, fallback_variant, staged_item_states
from batch_pipeline.core.ledger.machine import ShardState
from batch_pipeline.core.ledger.reconcile import DEAD, MISSING, VALID, item_states
from batch_pipeline.core.run.summary import ShardSummary
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.state.driver import Action, JobFacts, Step, shard_step

BASE = {
    "name": "t",
    "input": {"path": "x.jsonl", "text_field": "body"},
    "prompt": {"version": "v1", "template": "{body}"},
    "model": "small",
    "backend": {"name": "openai_batch"},
    "sampling": {"max_tokens": 16},
    "output": {"text": {}},
    "retries": {"per_item": 2},
}
ITEMS = pl.DataFrame({"request_id": ["a", "b", "c", "d"], "shard_id": ["s"] * 4})


def spec(**over) -> JobSpec:
    return JobSpec.model_validate({**BASE, **over})


def row(
    rid: str,
    attempt: int,
    status: str,
    error_class: str | None = None,
    model: str = "small",
    backend: str = "openai_batch",
) -> dict:
    return {
        "request_id": rid,
        "attempt": attempt,
        "status": status,
        "error_class": error_class,
        "error_code": None if status == "succeeded" else "x",
        "error_message": None,
        "model": model,
        "backend": backend,
    }


RESULTS = pl.DataFrame(
    [
        row("a", 1, "succeeded"),
        row("b", 1, "failed", "transient"),
        row("b", 2, "failed", "transient"),  # budget spent: handed over
        row("c", 1, "failed", "poison"),  # non-retryable: handed over
        row("d", 1, "failed", "systemic"),
        row("d", 2, "failed", "systemic"),  # systemic: never handed over
        row("b", 3, "succeeded", model="big"),  # the fallback answered b
    ]
)


def states(s: JobSpec) -> dict[str, tuple[str, str]]:
    out = staged_item_states(s, ITEMS, RESULTS)
    return {r["request_id"]: (r["state"], r["stage"]) for r in out.iter_rows(named=True)}


def test_spent_and_poisoned_items_go_to_the_fallback_systemic_ones_never():
    got = states(spec(fallback={"model": "big"}))
    assert got == {
        "a": (VALID, "primary"),
        "b": (VALID, "fallback"),
        "c": (MISSING, "fallback"),
        "d": (MISSING, "primary"),
    }


def test_without_a_fallback_the_states_are_the_plain_ones():
    plain = item_states(ITEMS, RESULTS, spec().retries)
    got = states(spec())
    assert {k: v[0] for k, v in got.items()} == dict(zip(plain["request_id"], plain["state"]))
    assert {v[1] for v in got.values()} == {"primary"}


def test_the_fallback_has_its_own_budget_then_the_item_is_dead():
    more = pl.concat(
        [
            RESULTS,
            pl.DataFrame(
                [row("c", 2, "failed", "transient", model="big"), row("c", 3, "failed", "transient", model="big")]
            ),
        ]
    )
    out = staged_item_states(spec(fallback={"model": "big"}), ITEMS, more)
    assert out.filter(pl.col("request_id") == "c").row(0, named=True)["state"] == DEAD
    assert out["request_id"].to_list() == ITEMS["request_id"].to_list()  # the items' order is kept


def test_a_row_is_the_fallbacks_by_model_and_backend():
    s = spec(fallback={"model": "small", "backend": {"name": "online"}})
    got = staged_item_states(s, ITEMS, RESULTS)  # b's answer by "big" on openai_batch is not this fallback's
    assert got.filter(pl.col("stage") == Stage.FALLBACK.value)["request_id"].to_list() == ["c"]
    variant = fallback_variant(s)
    assert (variant.model, variant.backend.name, variant.name) == ("small", "online", "t")


def summary(retryable: int, fallback_pending: int) -> ShardSummary:
    return ShardSummary(
        shard_id="s",
        state=ShardState.COLLECTED,
        expected=10,
        valid=10 - retryable,
        missing=retryable,
        attempts=2,
        fallback_pending=fallback_pending,
    )


def test_the_driver_sends_the_primarys_items_first_then_the_fallbacks():
    first = shard_step(summary(3, 1), JobFacts())
    assert isinstance(first, Step) and first.action == Action.SUBMIT and not first.fallback
    assert "2 retryable" in first.reason
    then = shard_step(summary(1, 1), JobFacts())
    assert isinstance(then, Step) and then.action == Action.SUBMIT and then.fallback
    assert "fallback" in then.reason


def test_the_primarys_minimum_counts_only_its_own_items():
    step = shard_step(summary(1, 1), JobFacts(min_batch=100))  # the fallback's item is not the primary's batch
    assert isinstance(step, Step) and step.fallback
