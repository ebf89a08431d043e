"""Reconciliation: every item is valid, invalid, missing or dead-lettered; the accounting balances or fails loudly."""

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batch_pipeline.core.errors import ErrorClass, ReconciliationError, classify_line_error
from batch_pipeline.core.ledger.reconcile import (
    DEAD,
    INVALID,
    MISSING,
    STATES,
    VALID,
    Counts,
    check_invariant,
    counts_by_shard,
    item_states,
    job_counts,
)

RESULT_SCHEMA = {
    "request_id": pl.String,
    "attempt": pl.Int32,
    "status": pl.String,
    "error_class": pl.String,
    "error_code": pl.String,
    "error_message": pl.String,
}

# outcome kind -> (status, error_class, error_code, burns budget)
OUTCOMES = {
    "ok": ("succeeded", None, None, False),
    "invalid": ("invalid", ErrorClass.INVALID_OUTPUT.value, "contract_violation", True),
    "truncated": ("invalid", ErrorClass.INVALID_OUTPUT.value, "truncated", True),
    "poison": ("errored", ErrorClass.POISON.value, "context_length_exceeded", True),
    "transient": ("errored", ErrorClass.TRANSIENT.value, "server_error", True),
    "systemic": ("errored", ErrorClass.SYSTEMIC.value, "invalid_api_key", False),
    "expired": ("errored", ErrorClass.TRANSIENT.value, "batch_expired", False),
    "cancelled": ("errored", ErrorClass.TRANSIENT.value, "batch_cancelled", False),
}


def items_frame(shards: dict[str, list[str]]) -> pl.DataFrame:
    rows = [(rid, sid) for sid, rids in shards.items() for rid in rids]
    return pl.DataFrame(rows, schema={"request_id": pl.String, "shard_id": pl.String}, orient="row")


def results_frame(history: list[tuple[str, int, str]]) -> pl.DataFrame:
    rows = [(rid, attempt, *OUTCOMES[kind][:3], f"{kind} message") for rid, attempt, kind in history]
    return pl.DataFrame(rows, schema=RESULT_SCHEMA, orient="row")


def states_of(items, results, budget) -> dict[str, str]:
    states = item_states(items, results, budget)
    return dict(zip(states["request_id"], states["state"]))


def test_the_four_categories():
    items = items_frame({"s1": ["ok", "bad", "never", "dead"], "s2": ["ok2", "late"]})
    results = results_frame(
        [
            ("ok", 1, "ok"),
            ("bad", 1, "invalid"),
            ("dead", 1, "poison"),
            ("dead", 2, "invalid"),
            ("dead", 3, "truncated"),
            ("ok2", 1, "transient"),
            ("ok2", 2, "ok"),
            ("late", 1, "invalid"),
            ("late", 2, "transient"),
        ]
    )
    assert states_of(items, results, 3) == {
        "ok": VALID,
        "bad": INVALID,
        "never": MISSING,
        "dead": DEAD,
        "ok2": VALID,
        "late": MISSING,
    }
    states = item_states(items, results, 3)
    counts = check_invariant(items, results, states)
    assert counts.as_dict() == {"expected": 6, "valid": 2, "invalid": 1, "missing": 2, "dead_lettered": 1}
    assert counts.retryable == 3 and counts.balanced
    per_shard = counts_by_shard(states)
    assert per_shard["s1"].as_dict() == {"expected": 4, "valid": 1, "invalid": 1, "missing": 1, "dead_lettered": 1}
    assert per_shard["s2"].as_dict() == {"expected": 2, "valid": 1, "invalid": 0, "missing": 1, "dead_lettered": 0}
    dead = states.filter(pl.col("request_id") == "dead").row(0, named=True)
    assert (dead["failures"], dead["attempts"], dead["last_error_code"]) == (3, 3, "truncated")


def test_budget_is_per_item():
    items = items_frame({"s": ["a", "b"]})
    results = results_frame([("a", 1, "poison"), ("a", 2, "poison"), ("b", 2, "poison")])
    assert states_of(items, results, 2) == {"a": DEAD, "b": MISSING}
    assert states_of(items, results, 3) == {"a": MISSING, "b": MISSING}
    assert states_of(items, results, 1) == {"a": DEAD, "b": DEAD}


@pytest.mark.parametrize("kind", ["systemic", "expired", "cancelled"])
def test_failures_that_are_not_the_items_fault_do_not_burn_the_budget(kind):
    items = items_frame({"s": ["a"]})
    results = results_frame([("a", n, kind) for n in range(1, 8)])
    states = item_states(items, results, 2)
    row = states.row(0, named=True)
    assert (row["state"], row["failures"], row["attempts"]) == (MISSING, 0, 7)
    # one real failure after them counts once
    more = pl.concat([results, results_frame([("a", 8, "poison")])])
    assert item_states(items, more, 2).row(0, named=True)["failures"] == 1


def test_success_after_failures_is_valid_even_past_the_budget():
    items = items_frame({"s": ["a"]})
    results = results_frame([("a", 1, "poison"), ("a", 2, "poison"), ("a", 3, "ok")])
    assert states_of(items, results, 2) == {"a": VALID}


def test_last_attempt_decides_between_invalid_and_missing_regardless_of_row_order():
    items = items_frame({"s": ["a", "b"]})
    results = results_frame([("a", 2, "invalid"), ("a", 1, "transient"), ("b", 2, "transient"), ("b", 1, "invalid")])
    assert states_of(items, results, 5) == {"a": INVALID, "b": MISSING}


def test_orphan_result_raises():
    items = items_frame({"s": ["a", "b"]})
    results = results_frame([("a", 1, "ok"), ("stranger", 1, "ok")])
    states = item_states(items, results, 3)
    with pytest.raises(ReconciliationError, match=r"1 results for request IDs the manifest does not know.*stranger"):
        check_invariant(items, results, states)


def test_item_in_two_shards_raises():
    items = items_frame({"s1": ["a", "b"], "s2": ["b"]})
    results = results_frame([("a", 1, "ok"), ("b", 1, "ok")])
    states = item_states(items, results, 3)
    with pytest.raises(ReconciliationError, match="appear in more than one shard"):
        check_invariant(items, results, states)


def test_states_that_lose_an_item_raise():
    items = items_frame({"s1": ["a", "b", "c"]})
    results = results_frame([("a", 1, "ok")])
    states = item_states(items, results, 3).filter(pl.col("request_id") != "c")
    with pytest.raises(ReconciliationError, match="states cover 2 items, manifest has 3"):
        check_invariant(items, results, states)


def test_valid_count_is_cross_checked_against_results():
    items = items_frame({"s1": ["a", "b"]})
    results = results_frame([("a", 1, "ok"), ("b", 1, "ok")])
    states = item_states(items, results, 3).with_columns(
        pl.when(pl.col("request_id") == "b").then(pl.lit(MISSING)).otherwise(pl.col("state")).alias("state")
    )
    with pytest.raises(ReconciliationError, match="2 items have a succeeded result but 1 are counted valid"):
        check_invariant(items, results, states)


def test_no_results_at_all():
    items = items_frame({"s1": ["a", "b"], "s2": ["c"]})
    results = pl.DataFrame(schema=RESULT_SCHEMA)
    states = item_states(items, results, 3)
    counts = check_invariant(items, results, states)
    assert counts.as_dict() == {"expected": 3, "valid": 0, "invalid": 0, "missing": 3, "dead_lettered": 0}


def test_counts_balance_and_job_totals():
    c = Counts(10, 4, 3, 2, 1)
    assert c.balanced and c.retryable == 5
    assert not Counts(10, 4, 3, 2, 0).balanced
    total = job_counts({"a": Counts(3, 1, 1, 1, 0), "b": Counts(2, 0, 0, 0, 2)})
    assert total.as_dict() == {"expected": 5, "valid": 1, "invalid": 1, "missing": 1, "dead_lettered": 2}


@pytest.mark.parametrize(
    "code,status,expected",
    [
        ("batch_expired", None, ErrorClass.TRANSIENT),
        ("rate_limit_exceeded", 429, ErrorClass.TRANSIENT),
        (None, 503, ErrorClass.TRANSIENT),
        (None, 408, ErrorClass.TRANSIENT),
        ("invalid_api_key", 401, ErrorClass.SYSTEMIC),
        (None, 403, ErrorClass.SYSTEMIC),
        ("model_not_found", 404, ErrorClass.SYSTEMIC),
        ("insufficient_quota", 429, ErrorClass.SYSTEMIC),
        ("context_length_exceeded", 400, ErrorClass.POISON),
        (None, 400, ErrorClass.POISON),
        ("something_new", None, ErrorClass.POISON),
    ],
)
def test_classify_line_error(code, status, expected):
    assert classify_line_error(code, status) == expected


# -- property: random histories ------------------------------------------------------------------
def reference_state(history: list[tuple[int, str]], budget: int) -> str:
    """The rules, written out plainly: valid if any success; dead once the item's own failures reach the
    budget; otherwise invalid if the latest attempt answered unusably; otherwise missing."""
    if any(kind == "ok" for _, kind in history):
        return VALID
    if sum(1 for _, kind in history if OUTCOMES[kind][3]) >= budget:
        return DEAD
    if history and OUTCOMES[max(history)[1]][0] == "invalid":
        return INVALID
    return MISSING


item_history = st.lists(st.sampled_from(list(OUTCOMES)), max_size=6).flatmap(
    lambda kinds: st.permutations(list(enumerate(kinds, start=1))).map(
        lambda perm: [(attempt, kind) for attempt, kind in perm]
    )
)


@settings(max_examples=150, deadline=None)
@given(
    shards=st.lists(st.lists(item_history, max_size=8), min_size=1, max_size=4),
    budget=st.integers(1, 4),
    skip=st.sets(st.integers(1, 6), max_size=3),
)
def test_random_histories_always_reconcile(shards, budget, skip):
    layout, history, expected_state = {}, [], {}
    for s, histories in enumerate(shards):
        sid = f"s{s}"
        layout[sid] = []
        for i, h in enumerate(histories):
            rid = f"{sid}-i{i}"
            layout[sid].append(rid)
            h = [(a, k) for a, k in h if a not in skip]  # an item is not in every attempt
            history.extend((rid, a, k) for a, k in h)
            expected_state[rid] = reference_state(h, budget)
    items = items_frame(layout)
    results = results_frame(history)
    states = item_states(items, results, budget)
    assert dict(zip(states["request_id"], states["state"])) == expected_state
    total = check_invariant(items, results, states)
    per_shard = counts_by_shard(states)
    for sid, rids in layout.items():
        if not rids:
            assert sid not in per_shard
            continue
        c = per_shard[sid]
        assert c.expected == len(rids) == c.valid + c.invalid + c.missing + c.dead_lettered
        for state in STATES:
            assert getattr(c, state) == sum(1 for r in rids if expected_state[r] == state)
    assert total.expected == len(expected_state)
    assert total.valid == sum(1 for v in expected_state.values() if v == VALID)
