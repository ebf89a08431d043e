"""The report's and the evals' plots keep every label inside the picture with their fixed margins, at the extremes
of what they show: a job of seconds (second labels), a million accepted items, dollar figures from
thousands down to millionths, accuracy weeks over years."""

import struct
from datetime import datetime, timedelta

import polars as pl
import pytest
from matplotlib.figure import Figure

from batch_pipeline.core.publish import plots

T0 = datetime(2026, 12, 6, 23, 59, 59, 999_000)


def timeline(step: timedelta, cost: float, accepted: int, points: int = 50) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "recorded_at": [T0 + step * i for i in range(points)],
            "cost_usd": [cost] * points,
            "accepted": [accepted] * points,
        }
    )


def assert_labels_inside(fig: Figure) -> None:
    """Every drawn artist (tick labels in view, axis labels, titles, legends) inside the picture."""
    fig.canvas.draw()  # as savefig draws it
    renderer = fig.canvas.get_renderer()
    box = fig.bbox
    try:
        for ax in fig.axes:
            drawn = ax.get_tightbbox(renderer)
            assert drawn is not None
            inside = drawn.x0 >= box.x0 and drawn.x1 <= box.x1 and drawn.y0 >= box.y0 and drawn.y1 <= box.y1
            assert inside, f"{ax.get_ylabel() or 'an axes'}: its labels span {drawn}, past the picture's {box.bounds}"
    finally:
        plots._pyplot().close(fig)


@pytest.mark.parametrize(
    ("step", "cost", "accepted"),
    [
        (timedelta(milliseconds=300), 0.0000012, 1),  # a job of seconds: second labels, millionths of a dollar
        (timedelta(seconds=40), 0.37, 20_000),  # an afternoon's job: day-hour labels, up to a million items
        (timedelta(days=9), 251.5, 19_000),  # a standing job over a year: month labels, ~$12,000
    ],
)
def test_the_report_plot_keeps_its_labels_inside_the_picture(step, cost, accepted):
    assert_labels_inside(plots.cost_over_time_figure(timeline(step, cost, accepted)))


def test_the_report_plot_of_a_job_with_no_results_is_a_picture():
    assert plots.cost_over_time(pl.DataFrame(schema={"recorded_at": pl.Datetime, "cost_usd": pl.Float64}))[:4] == (
        b"\x89PNG"
    )


def test_the_accuracy_plot_keeps_its_labels_inside_the_picture():
    weeks = [f"2026-W{w:02d}" for w in range(1, 53)]
    history = pl.DataFrame(
        {
            "week": weeks,
            "accuracy": [0.9] * 52,
            "accuracy_low": [0.85] * 52,
            "accuracy_high": [0.95] * 52,
            "b_accuracy": [0.8] * 52,
        }
    )
    assert_labels_inside(plots.accuracy_history_figure(history))


def test_a_plot_is_a_whole_png():
    png = plots.cost_over_time(timeline(timedelta(seconds=1), 0.01, 5))
    assert png[12:16] == b"IHDR" and struct.unpack(">II", png[16:24]) == (700, 320)  # 7 x 3.2 inches at 100 dpi
    assert png.endswith(b"IEND\xaeB`\x82")
