"""What every asset of one job spec shares: keys ``<job>/<asset>``, its group and labels, the shard and weekly
partitions and the shard steps' pools (``JobFrame``, over each asset's row of defs/catalog.py), and the helpers the
asset builders all use."""

from dataclasses import dataclass, field
from functools import cached_property

import dagster as dg

from batch_pipeline.core.errors import BatchPipelineError
from batch_pipeline.core.settings import Settings
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.defs.catalog import JOB_ASSETS, AssetEntry, Partitioning
from batch_pipeline.defs.k8s import GPU_POOL, gpu_step_tags, is_gpu_backend
from batch_pipeline.defs.metadata import spec_labels
from batch_pipeline.executors.registry import account_pool

SHARDS_TAG = "batch_pipeline/shards"  # the shards a range run moves (the others in its range are left alone)
WEEKLY = dg.WeeklyPartitionsDefinition(start_date="2026-01-04", day_offset=1)  # the weekly eval's; weeks start Monday


def shards_partitions(spec: JobSpec) -> dg.DynamicPartitionsDefinition:
    return dg.DynamicPartitionsDefinition(name=f"{spec.name}_shards")


def asset_key(spec: JobSpec, name: str) -> dg.AssetKey:
    return dg.AssetKey([spec.name, name])


def add_new_partitions(
    instance: dg.DagsterInstance, partitions: dg.DynamicPartitionsDefinition, keys: list[str]
) -> None:
    """Add the ``keys`` the instance does not hold yet for ``partitions`` (new ones, or all on a fresh instance)."""
    known = set(instance.get_dynamic_partitions(partitions.name))
    missing = [k for k in keys if k not in known]
    if missing:
        instance.add_dynamic_partitions(partitions.name, missing)


def moving_shards(context: dg.AssetExecutionContext) -> list[str]:
    """The shards this run moves: its partition keys, or those of them its ``SHARDS_TAG`` names (a range run
    packed by ``shard_ranges`` leaves the other shards of its range to their own steps)."""
    keys = list(context.partition_keys)
    named = context.run.tags.get(SHARDS_TAG)
    if not named:
        return keys
    wanted = set(named.split(","))
    return [k for k in keys if k in wanted]


def clean_failure(call):
    """Our errors become a Dagster Failure whose description is the message a user needs (no traceback)."""
    try:
        return call()
    except BatchPipelineError as exc:
        raise dg.Failure(description=f"{type(exc).__name__}: {exc}") from exc


@dataclass(frozen=True, eq=False)
class JobFrame:
    """What every asset of one job spec shares: its key prefix and group, the spec's labels, the shard partitions
    and, for the shard steps, their pools and tags."""

    spec: JobSpec
    settings: Settings = field(default_factory=Settings)  # the edge's (the defaults when none is handed down)

    @property
    def job(self) -> str:
        return self.spec.name

    @cached_property
    def paths(self) -> JobPaths:
        return JobPaths(self.spec.name)

    @cached_property
    def shards(self) -> dg.DynamicPartitionsDefinition:
        return shards_partitions(self.spec)

    def key(self, name: str) -> dg.AssetKey:
        return asset_key(self.spec, name)

    def asset_args(self, name: str) -> dict:
        """The ``dg.asset`` arguments of ``<job>/<name>``: its row of the job's asset table (defs/catalog.py)."""
        entry = JOB_ASSETS[name]
        return {
            "key": self.key(name),
            "deps": self.deps_of(entry),
            "group_name": self.job,
            **spec_labels(self.spec),  # the spec's owners and tags, on every asset of the job
            "kinds": set(entry.kinds),
            "description": entry.describe(self.job),
            **self.partition_args(entry.partitions),
        }

    def deps_of(self, entry: AssetEntry) -> list[dg.AssetKey]:
        """The keys an asset reads: its upstream assets of this job and, on a later pass of a multi-pass job
        (``input.from_job``), the upstream job's asset it reads."""
        deps = [self.key(d) for d in entry.deps]
        upstream_job = self.spec.input.from_job
        if upstream_job and entry.upstream_job_asset:
            deps.append(dg.AssetKey([upstream_job, entry.upstream_job_asset]))
        return deps

    def partition_args(self, partitions: Partitioning | None) -> dict:
        """The ``dg.asset`` arguments of an asset's partitions: a shard step's, or the weekly eval's."""
        if partitions == "shard":
            return self.shard_step_args()
        if partitions == "week":
            return {"partitions_def": WEEKLY}
        return {}

    def shard_step_args(self) -> dict:
        """A shard asset's partitions, backfill policy and step options: self-hosted vLLM steps hold a GPU (pod
        tags for the k8s executor, the ``gpu`` pool); provider batch steps share one pool per provider account."""
        if is_gpu_backend(self.spec.backend.name):
            step = {"op_tags": gpu_step_tags(self.settings.k8s), "pool": GPU_POOL}
        else:
            pool = account_pool(self.spec.backend)
            step = {"pool": pool} if pool else {}
        # a UI backfill of the shards runs ``shards_per_run`` of them per run (each shard takes the driver's step)
        policy = dg.BackfillPolicy.multi_run(max_partitions_per_run=self.settings.shards_per_run)
        return {"partitions_def": self.shards, "backfill_policy": policy, **step}
