"""A shard whose label distribution is skewed (a sandbox scenario) is flagged by the per-shard check, which reads
the results a group of shards at a time and finds what a read of the whole table finds."""

import dagster as dg
import polars as pl
from polars.testing import assert_frame_equal

from batch_pipeline.core.ledger.result_parts import read_results
from batch_pipeline.core.publish.scan import job_shard_outliers
from batch_pipeline.core.quality.shard_stats import shard_outliers
from batch_pipeline.core.store import Store
from batch_pipeline.defs.assets import asset_key
from batch_pipeline.defs.build import build_definitions
from batch_pipeline.defs.pipeline import run_job


def test_a_skewed_shard_is_flagged_and_the_others_are_not(sandbox, make_job, instance, resources, home):
    spec = make_job(canary_first=False)
    defs = build_definitions([spec], resources)
    assets = [*defs.assets, *defs.asset_checks]
    dg.materialize(
        assets,
        selection=[asset_key(spec, "manifest"), asset_key(spec, "quote")],
        instance=instance,
        resources=defs.resources,
    )
    sandbox.set_scenario("skew_labels", label="feature_request")  # this batch answers everything the same
    dg.materialize(
        assets,
        selection=[asset_key(spec, "submissions"), asset_key(spec, "shard_results")],
        partition_key="s00003",
        instance=instance,
        resources=defs.resources,
    )
    sandbox.set_scenario("normal")
    run_job(spec, instance, resources)  # the rest, then publish with the checks
    stats = shard_outliers(read_results(Store(home), spec.name), "choice")
    flagged = stats.filter(pl.col("flagged").is_not_null())
    assert flagged["shard_id"].to_list() == ["s00003"] and "label distribution" in flagged["flagged"][0]
    check = instance.event_log_storage.get_latest_asset_check_execution_by_key(
        [dg.AssetCheckKey(asset_key(spec, "results"), "shard_distributions")]
    )
    evaluation = next(iter(check.values())).event.dagster_event.event_specific_data
    assert not evaluation.passed and evaluation.metadata["flagged_shards"].value == "s00003"
    # the check reads a group of shards at a time: one shard per group gives the whole-table figures
    for group_items in (1, 10**9):
        streamed = job_shard_outliers(spec, Store(home), group_items=group_items)
        assert_frame_equal(streamed, stats, rel_tol=1e-9)  # sums in another order: the last bits may differ
