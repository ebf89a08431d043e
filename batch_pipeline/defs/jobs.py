"""Per job spec, the Dagster jobs a run goes through: prepare -> (submit -> collect | shards) -> publish.

``<job>_shards`` submits and collects in one run (the CLI and the UI); sensors use ``<job>_submit`` and
``<job>_collect`` so that no run waits on a provider's batch window.
"""

import dagster as dg
from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.defs.assets import asset_key, shards_partitions
from batch_pipeline.defs.metadata import spec_labels

PREPARE_ASSETS = ["manifest", "quote"]  # and backend_comparison, for a spec with cost_compare
# the publish run: stage, the blocking checks (on results), promote, then what reads the promoted table
PUBLISH_ASSETS = ["results", "validated", "dead_letters", "report"]


def job_names(spec: JobSpec) -> dict[str, str]:
    return {stage: f"{spec.name}_{stage}" for stage in ("prepare", "quote", "shards", "submit", "collect", "publish")}


def build_jobs(spec: JobSpec) -> dict[str, UnresolvedAssetJobDefinition]:
    names = job_names(spec)
    shards = shards_partitions(spec)
    labels = spec_labels(spec)  # the spec's owners and tags

    def job(name: str, **kwargs) -> UnresolvedAssetJobDefinition:
        return dg.define_asset_job(name, **labels, **kwargs)

    def assets(*names_: str) -> dg.AssetSelection:
        return dg.AssetSelection.assets(*[asset_key(spec, n) for n in names_])

    jobs = [
        job(
            names["prepare"],
            selection=assets(*PREPARE_ASSETS, *(["backend_comparison"] if spec.cost_compare else [])),
            description="Build the manifest and the quote (and, with cost_compare, the backend comparison).",
        ),
        job(
            names["quote"],
            selection=assets("quote"),
            description="Quote the remaining work again (a quote expires after 30 minutes).",
        ),
        job(
            names["shards"],
            selection=assets("submissions", "shard_results"),
            partitions_def=shards,
            description="Submit and collect shards (one run can take a range of shards).",
        ),
        job(
            names["submit"],
            selection=assets("submissions"),
            partitions_def=shards,
            description="Submit a shard's pending items and return (the batch sensor collects).",
        ),
        job(
            names["collect"],
            selection=assets("shard_results"),
            partitions_def=shards,
            description="Collect a shard whose provider batch has ended.",
        ),
        job(
            names["publish"],
            selection=assets(*PUBLISH_ASSETS),
            description="Stage the table, run the blocking checks, promote it to validated only "
            "when they all pass; dead letters and the report.",
        ),
    ]
    return dict(zip(names, jobs))
