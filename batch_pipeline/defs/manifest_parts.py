"""The manifest beyond one machine: input files as a dynamic partition set, each prepared in its own step.

``<job>/manifest_file_part`` is partitioned by input file (``<job>_input_files``, keys from ``part_key``):
each partition reads, normalises and hashes one file (a process under the multiprocess executor, a pod under
the k8s one). ``<job>/manifest_merge`` then deals the prepared parts against the on-disk index; it is the
ordinary build, so a file without a part is read by the merge itself. ``register_input_files`` adds the
partitions of the files the next generation has to read. Thin: the work is in ``core/manifest/parts.py``.
"""

import re
import time
from collections.abc import Callable
from functools import partial

import dagster as dg
import polars as pl

from batch_pipeline.core.manifest.parts import (
    FileParts,
    part_key,
    pending_files,
    prepare_file_part,
)
from batch_pipeline.core.manifest.shards import Manifest, ShardCaps, build_manifest
from batch_pipeline.core.settings import Settings
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline.defs.catalog import JOB_ASSETS
from batch_pipeline.defs.frame import add_new_partitions, asset_key, clean_failure, shards_partitions
from batch_pipeline.defs.k8s import manifest_file_step_tags, manifest_merge_step_tags
from batch_pipeline.defs.metadata import plain, spec_labels
from batch_pipeline.defs.prepare_assets import manifest_metadata
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


# -- the default graph on Kubernetes: the manifest asset as one step per pending input file, then the merge ----------
MIN_FILES_FOR_STEPS = 2  # one pending file is read by the merge itself: a step of its own would only add a pod


def uses_file_steps(spec: JobSpec, settings: Settings) -> bool:
    """Whether ``<job>/manifest`` is built as per-file steps and a merge: on the k8s executor (each step a pod), for
    a job whose input is files (a later pass reads another job's table: nothing to split by file)."""
    return settings.k8s.executor == "k8s" and not spec.input.from_job


def mapping_key(key: str) -> str:
    """A ``part_key`` as a Dagster mapping key (letters, digits and underscores only)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", key)


def _progress_logger(context: dg.OpExecutionContext) -> Callable[[str, int], None]:
    last = [time.monotonic()]

    def progress(source: str, rows: int) -> None:
        if time.monotonic() - last[0] > 10:
            last[0] = time.monotonic()
            context.log.info(f"manifest: {rows:,} rows read (now {source})")

    return progress


def manifest_graph_asset(spec: JobSpec) -> dg.AssetsDefinition:
    """``<job>/manifest`` as a graph: ``<job>__manifest_files`` lists the files the next generation reads and fans
    out one ``<job>__manifest_file`` step per file (when there are at least ``MIN_FILES_FOR_STEPS``; else none),
    then ``<job>__manifest_merge`` builds the generation from the prepared parts (``FileParts``): the same shards
    as the one-step asset. Steps pass no values (``Nothing``): on Kubernetes each is a pod, and the parts are in
    the store. Pod resources: ``manifest_file_step_tags`` / ``manifest_merge_step_tags`` (defs/k8s.py)."""
    job, caps = spec.name, _caps(spec)

    @dg.op(name=f"{job}__manifest_files", out=dg.DynamicOut(dg.Nothing))  # a listing: the default pod
    def manifest_files(context: dg.OpExecutionContext, store: StoreResource):
        keys = [part_key(p.file.uri) for p in pending_files(spec, store.get())]
        steps = len(keys) >= MIN_FILES_FOR_STEPS
        context.log.info(f"{len(keys)} input file(s) to read" + ("" if steps else ": the merge reads them"))
        if steps:
            for key in keys:
                yield dg.DynamicOutput(None, mapping_key=mapping_key(key))

    @dg.op(
        name=f"{job}__manifest_file",
        ins={"listed": dg.In(dg.Nothing)},
        out=dg.Out(dg.Nothing),
        tags=manifest_file_step_tags(),
    )
    def manifest_file(context: dg.OpExecutionContext, store: StoreResource) -> None:
        st = store.get()
        wanted = context.get_mapping_key()
        keys = [k for k in (part_key(p.file.uri) for p in pending_files(spec, st)) if mapping_key(k) == wanted]
        record = prepare_file_part(spec, st, keys[0], caps.max_bytes) if keys else None
        if record is None:  # gone or already read since the listing: the merge sees the current files
            context.log.info(f"{wanted}: nothing to read")
            return
        context.log.info(f"{record.uri}: {sum(record.blocks_rows_in):,} rows prepared from byte {record.offset:,}")

    @dg.op(
        name=f"{job}__manifest_merge",
        ins={"parts": dg.In(dg.Nothing)},
        out=dg.Out(dg.Nothing),
        tags=manifest_merge_step_tags(spec.shards.manifest_memory_mb),
    )
    def manifest_merge(context: dg.OpExecutionContext, store: StoreResource) -> None:
        st = store.get()
        parts = FileParts(spec, st)
        build = partial(build_manifest, spec, st, progress=_progress_logger(context), caps=caps, parts=parts)
        summary = clean_failure(build)
        from_parts = [p.record.uri for p in parts.used]
        parts.discard_used()
        add_new_partitions(context.instance, shards_partitions(spec), Manifest(job, st).shard_ids())
        rejects = pl.from_arrow(Manifest(job, st).rejects())
        context.log.info(
            f"manifest gen {summary.generation}: files {summary.files_line()}; {len(from_parts)} from "
            f"prepared parts; {summary.new_requests} new requests in {len(summary.new_shards)} new shards"
        )
        meta = manifest_metadata(summary, rejects, st.uri(f"{JobPaths(job).root}/manifest/items"))
        meta["files_from_parts"] = dg.MetadataValue.json(from_parts)
        context.add_output_metadata(meta)

    entry = JOB_ASSETS["manifest"]

    @dg.graph_asset(
        key=asset_key(spec, "manifest"),
        group_name=job,
        kinds=set(entry.kinds),
        description=entry.describe(job) + " Built as one step per input file, then the merge.",
        **spec_labels(spec),
    )
    def manifest():
        return manifest_merge(manifest_files().map(manifest_file).collect())

    return manifest


def with_file_steps(spec: JobSpec, settings: Settings, assets: list[dg.AssetsDefinition]) -> list[dg.AssetsDefinition]:
    """``assets`` with ``<job>/manifest`` as per-file steps and a merge when ``uses_file_steps``; else as given."""
    if not uses_file_steps(spec, settings):
        return assets
    key = asset_key(spec, "manifest")
    return [manifest_graph_asset(spec) if key in a.keys else a for a in assets]
