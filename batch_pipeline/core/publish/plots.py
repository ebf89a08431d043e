"""PNG plots for reports and evals (matplotlib, headless)."""

import io
from datetime import datetime
from typing import TYPE_CHECKING

import polars as pl

if TYPE_CHECKING:  # matplotlib is imported when a plot is drawn, not with the module
    from matplotlib.figure import Figure


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# Fixed margins for the 7 x 3.2 inch figures: room for the widest labels they can have (``test_plots`` draws the
# extremes: second and month date labels, a million on the right axis, millionths of a dollar). The layout
# pass ``tight_layout`` made drew the whole figure once more to measure it: 101 -> 63 CPU ms a plot, at every publish.
MARGINS = {"left": 0.11, "right": 0.87, "bottom": 0.27, "top": 0.9}


def _laid_out(fig: "Figure") -> "Figure":
    fig.subplots_adjust(**MARGINS)
    return fig


def _png(fig: "Figure") -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    _pyplot().close(fig)
    return buf.getvalue()


def cost_over_time(results: pl.DataFrame) -> bytes:
    """``cost_over_time_figure`` as PNG bytes."""
    return _png(cost_over_time_figure(results))


def cost_over_time_figure(results: pl.DataFrame) -> "Figure":
    """Cumulative cost (left axis) and accepted items (right axis) against the time results were recorded.

    ``results``: result rows (recorded_at, cost_usd, status), or a timeline already summed per recording time
    (recorded_at, cost_usd, accepted: ``JobScan.timeline``, thousands of points for a job of millions of rows)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.2), dpi=100)
    if results.height:
        accepted = (
            pl.col("accepted") if "accepted" in results.columns else (pl.col("status") == "succeeded").cast(pl.Int64)
        )
        ordered = results.sort("recorded_at").with_columns(
            pl.col("cost_usd").cum_sum().alias("cum_cost"), accepted.cum_sum().alias("cum_accepted")
        )
        times: list[datetime] = ordered["recorded_at"].to_list()
        ax.step(times, ordered["cum_cost"].to_list(), where="post", color="tab:red", label="cumulative cost (USD)")
        ax2 = ax.twinx()
        ax2.step(times, ordered["cum_accepted"].to_list(), where="post", color="tab:blue", label="accepted items")
        ax2.set_ylabel("accepted items")
        ax.tick_params(axis="x", labelrotation=30, labelsize=7)
    ax.set_ylabel("USD")
    ax.set_title("spend and accepted items over time", fontsize=9)
    return _laid_out(fig)


def accuracy_history(history: pl.DataFrame) -> bytes:
    """``accuracy_history_figure`` as PNG bytes."""
    return _png(accuracy_history_figure(history))


def accuracy_history_figure(history: pl.DataFrame) -> "Figure":
    """Weekly golden-set accuracy with its interval (and the comparison side when there is one)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.2), dpi=100)
    weeks = history["week"].to_list()
    ax.fill_between(
        weeks, history["accuracy_low"].to_list(), history["accuracy_high"].to_list(), alpha=0.25, label="95% interval"
    )
    ax.plot(weeks, history["accuracy"].to_list(), marker="o", label="golden-set accuracy")
    if "b_accuracy" in history.columns and history["b_accuracy"].drop_nulls().len():
        ax.plot(weeks, history["b_accuracy"].to_list(), marker="s", linestyle="--", label="comparison (B)")
    ax.set_ylim(0, 1.02)
    ax.set_ylabel("accuracy")
    ax.tick_params(axis="x", labelrotation=30, labelsize=7)
    ax.legend(loc="lower left", fontsize=7)
    return _laid_out(fig)
