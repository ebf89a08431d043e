"""The publish assets of one job: ``results`` (the staged table the blocking checks run on), ``validated`` (promoted
only when they all passed), ``dead_letters`` and ``report``."""

import base64
from collections.abc import Callable
from datetime import UTC, datetime

import dagster as dg
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

from batch_pipeline.core.manifest.shards import Manifest
from batch_pipeline.core.publish.plots import cost_over_time
from batch_pipeline.core.publish.report import build_report, shard_table
from batch_pipeline.core.publish.tables import JobState, dead_letters, promote, stage
from batch_pipeline.core.run.hygiene import sweep_leftovers
from batch_pipeline.core.store import Store
from batch_pipeline.defs.checks import CHECKS
from batch_pipeline.defs.frame import JobFrame
from batch_pipeline.defs.metadata import md_table, money_json, plain, provider_ceilings, table_meta
from batch_pipeline.defs.resources import StoreResource
from batch_pipeline.defs.runners import executor_for


def unpassed_checks(instance: dg.DagsterInstance, results_key: dg.AssetKey) -> list[str]:
    """The blocking checks that did not pass on the latest materialization of ``results`` (empty: promote).

    Dagster already skips ``validated`` in a run where a blocking check failed; this also refuses a run that
    selects ``validated`` alone after a failed (or unchecked) ``results``.
    """
    latest = instance.fetch_materializations(results_key, limit=1).records
    if not latest:
        return [f"{results_key.to_user_string()} was never materialized"]
    keys = [dg.AssetCheckKey(results_key, name) for name in CHECKS]
    records = instance.event_log_storage.get_latest_asset_check_execution_by_key(keys)
    out = []
    for key in keys:
        rec = records.get(key)
        done = rec is not None and rec.status in (
            AssetCheckExecutionRecordStatus.SUCCEEDED,
            AssetCheckExecutionRecordStatus.FAILED,
        )
        target = rec.evaluation.target_materialization_data if done and rec.evaluation else None
        if target is None or target.storage_id != latest[0].storage_id:
            out.append(f"{key.name} has not run on the latest materialization")
        elif rec.status != AssetCheckExecutionRecordStatus.SUCCEEDED:
            out.append(f"{key.name} failed")
    return out


StoreStepBody = Callable[[JobFrame, dg.AssetExecutionContext, Store], dg.MaterializeResult]


def store_step(frame: JobFrame, name: str, body: StoreStepBody) -> dg.AssetsDefinition:
    """``<job>/<name>``, a publish step: ``body`` reads and writes the job's store."""

    @dg.asset(**frame.asset_args(name))
    def step(context: dg.AssetExecutionContext, store: StoreResource) -> dg.MaterializeResult:
        return body(frame, context, store.get())

    return step


def stage_results(frame: JobFrame, context: dg.AssetExecutionContext, st: Store) -> dg.MaterializeResult:
    """The staged table the blocking checks run on (provider copies a killed run left swept first)."""
    spec, job, paths = frame.spec, frame.job, frame.paths
    if Manifest(job, st).last_generation() == 0:
        raise dg.Failure(f"job {job} has no manifest in {st.root}; materialize {job}/manifest first")
    swept = sweep_leftovers(spec, st, executor_for(spec))  # provider copies a killed run left (retention)
    if swept.discarded or swept.failed:
        (context.log.warning if swept.failed else context.log.info)(f"provider copies: {swept.describe()}")
    state = JobState.load(spec, st)
    outputs = stage(spec, st, state)
    head, rows = st.read_head(paths.staged)  # footer + first rows: a 10M-row table is not read whole
    table = pl.from_arrow(head)
    context.log.info(f"staged table: {rows} rows -> {outputs['staged']}")
    meta = plain({"rows": rows, **outputs})
    meta["preview"] = md_table(
        table.select("source_key", "output", "attempt", "input_tokens", "output_tokens", "cost_usd", "is_duplicate")
    )
    meta.update(table_meta(table.schema, rows))
    return dg.MaterializeResult(metadata=meta)


def promote_staged(frame: JobFrame, context: dg.AssetExecutionContext, st: Store) -> dg.MaterializeResult:
    """The validated table: the staged one, promoted only when every blocking check passed on it."""
    spec, job, paths = frame.spec, frame.job, frame.paths
    unpassed = unpassed_checks(context.instance, frame.key("results"))
    if unpassed:
        raise dg.Failure(
            description=f"not promoting {job}/results: {'; '.join(unpassed)}; the validated table is unchanged"
        )
    outputs = promote(spec, st)
    footer = pq.read_metadata(pa.BufferReader(st.read_bytes(paths.validated)))
    rows = footer.num_rows
    context.log.info(f"validated table: {rows} rows -> {outputs['validated']}")
    meta = plain({"rows": rows, **outputs})
    meta.update(table_meta(footer.schema.to_arrow_schema(), rows))
    return dg.MaterializeResult(metadata=meta)


def show_dead_letters(frame: JobFrame, context: dg.AssetExecutionContext, st: Store) -> dg.MaterializeResult:
    dead = dead_letters(JobState.load(frame.spec, st))
    return dg.MaterializeResult(
        metadata={
            "count": dg.MetadataValue.int(dead.height),
            "preview": md_table(dead.select("request_id", "failures", "last_error_code", "last_error")),
            **table_meta(dead.schema, dead.height),
        }
    )


def report_metadata(rep: dict, png: bytes, plot_path: str, shards: list[dict]) -> dict:
    """The report's metadata: its scalar figures, its money tables in dollars, the spend plot and the shards."""
    meta = plain({k: v for k, v in rep.items() if not isinstance(v, dict | list)})
    for key in ("cost_by_pricing", "quoted_vs_actual", "cost_by_attempt"):  # amounts as dollars
        meta[key] = dg.MetadataValue.json(
            money_json(rep.get(key) or {}, money=key.startswith("cost_"), money_keys=("first_pass", "retries"))
        )
    if rep.get("golden_accuracy_by_shard"):
        meta["golden_accuracy_by_shard"] = md_table(pl.DataFrame(rep["golden_accuracy_by_shard"]), limit=50)
    meta["plot"] = dg.MetadataValue.md(f"![spend](data:image/png;base64,{base64.b64encode(png).decode()})")
    meta["plot_path"] = dg.MetadataValue.path(plot_path)
    meta["shards"] = md_table(pl.DataFrame(shards), limit=50)
    if rep["open_batches"] or rep["held_shards"]:
        meta["open_batches"] = dg.MetadataValue.json(rep["open_batches"])
        meta["held_shards"] = dg.MetadataValue.json(rep["held_shards"])
    return meta


def publish_report(frame: JobFrame, context: dg.AssetExecutionContext, st: Store) -> dg.MaterializeResult:
    spec, job, paths = frame.spec, frame.job, frame.paths
    state = JobState.load(spec, st)
    outputs = {"validated": st.uri(paths.validated), "duckdb": str(st.local_path(paths.duckdb) or "")}
    rep = build_report(spec, st, state, outputs=outputs)
    rep.update(provider_ceilings(spec, st))  # open batches against their window and retention; held shards
    # when this publish ended, and of which manifest: `status` says the job is done (and when) from these
    rep["published_at"] = datetime.now(UTC).isoformat()
    rep["manifest_generation"] = Manifest(job, st).last_generation()
    st.write_json(paths.report, rep)
    png = cost_over_time(state.scan.timeline)  # summed per recording time by the streaming scan
    st.write_bytes(f"{paths.root}/report.png", png)
    plot_path = st.uri(f"{paths.root}/report.png")
    return dg.MaterializeResult(metadata=report_metadata(rep, png, plot_path, shard_table(state)))


def results_asset(frame: JobFrame) -> dg.AssetsDefinition:
    return store_step(frame, "results", stage_results)


def validated_asset(frame: JobFrame) -> dg.AssetsDefinition:
    return store_step(frame, "validated", promote_staged)


def dead_letters_asset(frame: JobFrame) -> dg.AssetsDefinition:
    return store_step(frame, "dead_letters", show_dead_letters)


def report_asset(frame: JobFrame) -> dg.AssetsDefinition:
    return store_step(frame, "report", publish_report)
