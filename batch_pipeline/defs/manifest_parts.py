"""The manifest beyond one machine: input files as a dynamic partition set, each prepared in its own step.

``<job>/manifest_file_part`` is partitioned by input file (``<job>_input_files``, keys from ``part_key``):
each partition reads, normalises and hashes one file (a process under the multiprocess executor, a pod under
the k8s one). ``<job>/manifest_merge`` then deals the prepared parts against the on-disk index; it is the
ordinary build, so a file without a part is read by the merge itself. ``register_input_files`` adds the
partitions of the files the next generation has to read. Thin: the work is in ``core/manifest/parts.py``.
"""

import dagster as dg

from batch_pipeline.core.manifest.parts import (
    FileParts,
    part_key,
    pending_files,
    prepare_file_part,
)
from batch_pipeline.core.manifest.shards import Manifest, ShardCaps, build_manifest
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.store import Store
from batch_pipeline.defs.frame import add_new_partitions, asset_key, shards_partitions
from batch_pipeline.defs.metadata import plain
from batch_pipeline.defs.resources import StoreResource
from batch_pipeline.executors.registry import batch_limits


def input_files_partitions(spec: JobSpec) -> dg.DynamicPartitionsDefinition:
    return dg.DynamicPartitionsDefinition(name=f"{spec.name}_input_files")


def register_input_files(instance: dg.DagsterInstance, spec: JobSpec, store: Store) -> list[str]:
    """Add a partition for every input file the next generation has to read; the keys of those files."""
    keys = [part_key(p.file.uri) for p in pending_files(spec, store)]
    add_new_partitions(instance, input_files_partitions(spec), keys)
    return keys


def _caps(spec: JobSpec) -> ShardCaps:
    return ShardCaps.of(spec, *batch_limits(spec.backend.name))


def build_manifest_parts(spec: JobSpec) -> tuple[list[dg.AssetsDefinition], list[dg.JobDefinition]]:
    """The file-part and merge assets of ``spec``, and a job for each (parts: partitioned; merge: one run)."""
    files = input_files_partitions(spec)
    job = spec.name

    @dg.asset(
        key=asset_key(spec, "manifest_file_part"),
        partitions_def=files,
        group_name=job,
        kinds={"python"},
        description="One input file read, normalised, rendered and hashed on its own (from its old end when "
        "it grew), stored as prepared blocks for the merge.",
    )
    def manifest_file_part(context: dg.AssetExecutionContext, store: StoreResource) -> dg.MaterializeResult:
        record = prepare_file_part(spec, store.get(), context.partition_key, _caps(spec).max_bytes)
        if record is None:
            return dg.MaterializeResult(metadata={"prepared": False, "reason": "nothing new to read in this file"})
        context.log.info(f"{record.uri}: {sum(record.blocks_rows_in):,} rows read from byte {record.offset:,}")
        return dg.MaterializeResult(
            metadata=plain(
                {
                    "prepared": True,
                    "source": record.uri,
                    "from_byte": record.offset,
                    "bytes_read": record.bytes_read,
                    "rows_read": sum(record.blocks_rows_in),
                    "rows_prepared": sum(record.blocks_rows),
                    "blocks": len(record.blocks_rows),
                }
            )
        )

    @dg.asset(
        key=asset_key(spec, "manifest_merge"),
        deps=[manifest_file_part],
        group_name=job,
        kinds={"python"},
        description="The prepared file parts dealt into new shards against the on-disk request-ID index.",
    )
    def manifest_merge(context: dg.AssetExecutionContext, store: StoreResource) -> dg.MaterializeResult:
        st = store.get()
        parts = FileParts(spec, st)
        summary = build_manifest(spec, st, caps=_caps(spec), parts=parts)
        from_parts = [p.record.uri for p in parts.used]
        parts.discard_used()
        add_new_partitions(context.instance, shards_partitions(spec), Manifest(job, st).shard_ids())
        context.log.info(
            f"manifest gen {summary.generation}: files {summary.files_line()}; {len(from_parts)} from "
            f"prepared parts; {summary.new_requests} new requests in {len(summary.new_shards)} shards"
        )
        meta = plain(
            {k: v for k, v in summary.as_dict().items() if k not in ("new_shards", "rejects_by_reason", "files")}
        )
        meta["input_files_by_action"] = dg.MetadataValue.text(summary.files_line())
        meta["files_from_parts"] = dg.MetadataValue.json(from_parts)
        return dg.MaterializeResult(metadata=meta)

    parts_job = dg.define_asset_job(
        f"{job}_manifest_file_parts", selection=[manifest_file_part.key], partitions_def=files
    )
    merge_job = dg.define_asset_job(f"{job}_manifest_merge", selection=[manifest_merge.key])
    return [manifest_file_part, manifest_merge], [parts_job, merge_job]
