"""Per job spec: three Dagster jobs, in the order a run goes (prepare -> shards -> publish)."""

import dagster as dg

from batch_pipeline.core.spec import JobSpec
from batch_pipeline.defs.assets import asset_key, shards_partitions


def job_names(spec: JobSpec) -> dict[str, str]:
    return {"prepare": f"{spec.name}_prepare", "shards": f"{spec.name}_shards", "publish": f"{spec.name}_publish"}


def build_jobs(spec: JobSpec) -> list:
    names = job_names(spec)
    key = lambda n: asset_key(spec, n)  # noqa: E731
    return [
        dg.define_asset_job(names["prepare"], selection=dg.AssetSelection.assets(key("manifest"), key("quote")),
                            description="Build the manifest and the quote."),
        dg.define_asset_job(names["shards"], selection=dg.AssetSelection.assets(key("submissions"), key("shard_results")),
                            partitions_def=shards_partitions(spec),
                            description="Submit and collect shards (one run can take a range of shards)."),
        dg.define_asset_job(names["publish"], selection=dg.AssetSelection.assets(
            key("results"), key("dead_letters"), key("report")),
            description="Publish the validated table, dead letters and the report; run the blocking checks."),
    ]
