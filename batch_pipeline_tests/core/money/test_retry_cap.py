"""The retry cap's inputs from result rows: which tries were first tries, which were retries, what each cost."""

import polars as pl

from batch_pipeline.core.money.retry_cap import RetryCosts, retry_costs


def _rows(*rows: tuple[str, int, str, str | None, str | None, float]) -> pl.DataFrame:
    return pl.DataFrame(
        rows,
        schema={
            "request_id": pl.String,
            "attempt": pl.Int32,
            "status": pl.String,
            "error_class": pl.String,
            "error_code": pl.String,
            "cost_usd": pl.Float64,
        },
        orient="row",
    )


def test_one_try_per_request_is_all_first_tries():
    rows = _rows(
        ("a", 1, "succeeded", None, None, 0.5),
        ("b", 1, "errored", "transient", "server_error", 0.25),
        ("c", 2, "invalid", None, None, 0.125),  # its first try here, whatever its number
    )
    assert retry_costs(rows) == RetryCosts(0.875, 3, 0.0, 0)


def test_a_try_after_a_failure_that_spent_the_budget_is_a_retry():
    rows = _rows(
        ("a", 1, "errored", "transient", "server_error", 0.5),
        ("a", 2, "succeeded", None, None, 0.25),  # a retry: attempt 1 failed for a reason of its own
        ("b", 1, "errored", "systemic", "insufficient_quota", 0.0),
        ("b", 2, "succeeded", None, None, 0.125),  # not a retry: a systemic stop spends no budget
        ("c", 1, "errored", "transient", "batch_expired", 0.0),
        ("c", 2, "succeeded", None, None, 0.0625),  # not a retry: the expired batch never tried it
        ("d", 1, "succeeded", None, None, 1.0),
    )
    assert retry_costs(rows) == RetryCosts(1.5, 4, 0.25, 1)


def test_a_row_stored_twice_counts_as_before():
    """Two rows of one request and attempt (a download fetched again) are not one try per request: both count."""
    rows = _rows(("a", 1, "succeeded", None, None, 0.5), ("a", 1, "succeeded", None, None, 0.5))
    assert retry_costs(rows) == RetryCosts(1.0, 2, 0.0, 0)


def test_no_results_cost_nothing():
    assert retry_costs(_rows()) == RetryCosts()
