"""The weekly eval: the schedule asks for the right week; the asset measures, compares and keeps history."""

from datetime import datetime

import dagster as dg
import polars as pl
import pytest

from batch_pipeline.core.quality.evals import paired, samples_needed, wilson
from batch_pipeline.core.spec.loading import load_spec
from batch_pipeline.core.store import Store
from batch_pipeline.defs.build import build_definitions
from batch_pipeline.defs.evals import build_eval_defs

from .conftest import REPO


@pytest.fixture
def demo():
    return load_spec(REPO / "data" / "jobs" / "demo.yaml")


@pytest.mark.parametrize(
    "now, week",
    [
        ("2026-11-30T06:00:00+00:00", "2026-11-23"),  # Monday 06:00: the week that just ended
        ("2026-12-03T12:00:00+00:00", "2026-11-23"),  # later that week: still the last complete week
        ("2026-12-07T06:00:00+00:00", "2026-11-30"),
    ],
)
def test_weekly_schedule_requests_the_last_complete_week(demo, instance, now, week):
    _, _, [schedule] = build_eval_defs(demo)
    context = dg.build_schedule_context(instance=instance, scheduled_execution_time=datetime.fromisoformat(now))
    requests = list(schedule.evaluate_tick(context).run_requests or [])
    assert [r.partition_key for r in requests] == [week]


def test_intervals_and_sample_sizes():
    ci = wilson(360, 400)
    assert ci.low < 0.9 < ci.high and ci.half_width == pytest.approx(0.03, abs=0.002)  # +-3 points at 400
    assert 380 <= samples_needed(0.9, 0.03) <= 400
    comparison = paired([True, True, False, False, True], [True, False, True, True, True])
    assert (comparison.b_wins, comparison.b_losses, comparison.ties) == (2, 1, 2)
    assert comparison.difference.estimate == pytest.approx(comparison.b_accuracy - comparison.a_accuracy)


def test_eval_asset_measures_compares_and_keeps_history(sandbox, demo, instance, resources, home):
    defs = build_definitions([demo], resources)
    key = dg.AssetKey(["demo", "eval"])
    golden_rows = sum(1 for _ in (REPO / "data" / "golden" / "demo.jsonl").open())
    for week in ("2026-11-16", "2026-11-23", "2026-11-23"):
        result = dg.materialize(
            [*defs.assets], selection=[key], partition_key=week, instance=instance, resources=defs.resources
        )
        assert result.success
    store = Store(home)
    history = pl.read_parquet(store.read_bytes("jobs/demo/evals/history.parquet"))
    assert history["week"].to_list() == ["2026-11-16", "2026-11-23"]  # a re-run replaces its week
    row = history.row(1, named=True)
    assert row["n"] == golden_rows
    assert row["accuracy_low"] <= row["accuracy"] <= row["accuracy_high"]
    assert row["b_prompt_version"] == "v1-terse"
    assert row["difference"] == pytest.approx(row["b_accuracy"] - row["accuracy"])
    assert row["difference"] == pytest.approx((row["b_wins"] - row["b_losses"]) / row["n"])
    assert store.read_bytes("jobs/demo/evals/history.png")[:8] == b"\x89PNG\r\n\x1a\n"
    materialization = instance.get_latest_materialization_event(key).asset_materialization
    assert "data:image/png;base64," in materialization.metadata["plot"].value
    # the sandbox honoured the contract: every answer is one of the labels
    online = [e for e in sandbox.ledger() if e.get("mode") == "online"]
    assert len(online) == 2 * 3 * golden_rows  # A and B, three materializations
