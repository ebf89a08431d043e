"""Per job spec, the assets of DESIGN section 3, keyed ``<job>/<asset>``. Thin: the work is in core/.

Each asset is built by a module-level builder of its concept over the job's ``JobFrame`` (defs/frame.py):
``prepare_assets`` (manifest, quote and its budget check, the backend comparison), ``shard_assets``
(submissions, shard_results) and ``publish_assets`` (results, validated, dead_letters, report).
``build_job_assets`` puts one job's together.
"""

import dagster as dg

from batch_pipeline.core.settings import Settings
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.defs.checks import build_result_checks, build_shard_stats_check
from batch_pipeline.defs.frame import SHARDS_TAG, JobFrame, asset_key, moving_shards, shards_partitions
from batch_pipeline.defs.prepare_assets import comparison_asset, manifest_asset, quote_asset, quote_budget_check
from batch_pipeline.defs.publish_assets import dead_letters_asset, report_asset, results_asset, validated_asset
from batch_pipeline.defs.shard_assets import shard_results_asset, submissions_asset

__all__ = ["SHARDS_TAG", "asset_key", "build_job_assets", "moving_shards", "shards_partitions"]


def build_job_assets(
    spec: JobSpec, settings: Settings | None = None
) -> tuple[list[dg.AssetsDefinition], list[dg.AssetChecksDefinition]]:
    """Every asset and check of one job spec, in graph order (``settings``: the edge's; unset: the defaults)."""
    frame = JobFrame(spec, settings or Settings())
    results = results_asset(frame)
    assets = [
        manifest_asset(frame),
        quote_asset(frame),
        submissions_asset(frame),
        shard_results_asset(frame),
        results,
        validated_asset(frame),
        dead_letters_asset(frame),
        report_asset(frame),
    ]
    if spec.cost_compare is not None:  # only a job that asks for a comparison has one; it runs with the manifest
        assets.append(comparison_asset(frame))
    checks = [quote_budget_check(frame), build_result_checks(spec, results), build_shard_stats_check(spec, results)]
    return assets, checks
