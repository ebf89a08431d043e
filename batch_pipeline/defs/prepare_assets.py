"""The prepare assets of one job: ``manifest`` (every item, its shard), ``quote`` (the remaining work priced) with
its blocking ``quote_within_budget`` check, and, for a spec with ``cost_compare``, ``backend_comparison``."""

import time

import dagster as dg
import polars as pl

from batch_pipeline.core.errors import BatchPipelineError
from batch_pipeline.core.manifest.parts import FileParts
from batch_pipeline.core.manifest.shards import Manifest, ShardCaps, build_manifest
from batch_pipeline.core.money.compare import compare_backends
from batch_pipeline.core.money.quote_record import Quote, read_quote
from batch_pipeline.core.pricing.usd import format_budget, format_usd
from batch_pipeline.core.publish.quoting import comparison_inputs, quote_job
from batch_pipeline.core.spec.job import CostCompareSpec
from batch_pipeline.defs.checks import check_description
from batch_pipeline.defs.frame import JobFrame, add_new_partitions, clean_failure
from batch_pipeline.defs.metadata import md_table, money_json, plain
from batch_pipeline.defs.resources import PricesResource, StoreResource
from batch_pipeline.executors.registry import batch_limits, route_profile, route_queues

PASS_MONEY = ("cost_low", "cost_expected", "cost_high")  # the amounts of a quote's passes


def manifest_metadata(summary, rejects: pl.DataFrame, items_dir: str) -> dict:
    """The manifest's metadata: its summary's counts, the input files, new shards and the rejects."""
    meta = plain({k: v for k, v in summary.as_dict().items() if k not in ("new_shards", "rejects_by_reason", "files")})
    meta["input_files_by_action"] = dg.MetadataValue.text(summary.files_line())
    meta["input_files_detail"] = dg.MetadataValue.json(summary.files)
    meta["new_shards"] = dg.MetadataValue.text(", ".join(summary.new_shards) or "none")
    meta["rejects_by_reason"] = dg.MetadataValue.json(summary.rejects_by_reason)
    meta["rejects_preview"] = md_table(rejects.select("source", "line", "field", "reason"))
    meta["items_dir"] = dg.MetadataValue.path(items_dir)
    return meta


def manifest_asset(frame: JobFrame) -> dg.AssetsDefinition:
    spec, job, paths, shards = frame.spec, frame.job, frame.paths, frame.shards

    @dg.asset(**frame.asset_args("manifest"))  # on a later pass, downstream of its upstream job's validated table
    def manifest(context: dg.AssetExecutionContext, store: StoreResource) -> dg.MaterializeResult:
        st = store.get()
        last = [time.monotonic()]

        def progress(source: str, rows: int) -> None:
            if time.monotonic() - last[0] > 10:
                last[0] = time.monotonic()
                context.log.info(f"manifest: {rows:,} rows read (now {source})")

        caps = ShardCaps.of(spec, *batch_limits(spec.backend.name))
        parts = FileParts(spec, st)  # files prepared in their own steps (defs/manifest_parts.py), if any
        # a bad input (an upstream filter naming no column, say) is its message, not a traceback
        summary = clean_failure(lambda: build_manifest(spec, st, progress=progress, caps=caps, parts=parts))
        parts.discard_used()
        add_new_partitions(context.instance, shards, Manifest(job, st).shard_ids())
        rejects = pl.from_arrow(Manifest(job, st).rejects())
        context.log.info(
            f"manifest gen {summary.generation}: files {summary.files_line()}; {summary.input_rows} rows "
            f"read, {summary.rejected_rows} rejected, {summary.new_requests} new requests in "
            f"{len(summary.new_shards)} new shards"
        )
        return dg.MaterializeResult(
            metadata=manifest_metadata(summary, rejects, st.uri(f"{paths.root}/manifest/items"))
        )

    return manifest


def quote_metadata(q: Quote) -> dict:
    """The quote's metadata: its range, budget, calibration and fingerprint; passes and route as tables."""
    est = q.est_cost_usd
    meta = plain(
        {
            "pending_requests": q.pending_requests,
            "cost_low_usd": est.low,
            "cost_expected_usd": est.expected,
            "cost_high_usd": est.high,
            "budget_usd": q.budget_usd,
            "within_budget": q.within_budget,
            "calibration": q.calibration.factor,
            "fingerprint": q.fingerprint[:16],
            "expires_at": q.expires_at,
        }
    )
    stored = q.as_json()  # passes as stored, dollars as dollars
    meta["passes"] = dg.MetadataValue.json(money_json(stored["passes"], money_keys=PASS_MONEY))
    if q.route:
        keep = ("shard_id", "backend", "model", "rule", "reason")
        meta["route"] = md_table(pl.DataFrame([{k: v for k, v in r.items() if k in keep} for r in q.route]), limit=50)
    meta["cache_hit_share"] = dg.MetadataValue.json(stored["cache_hit_share"])
    return meta


def quote_asset(frame: JobFrame) -> dg.AssetsDefinition:
    spec, paths = frame.spec, frame.paths

    @dg.asset(**frame.asset_args("quote"))
    def quote(context: dg.AssetExecutionContext, store: StoreResource, prices: PricesResource) -> dg.MaterializeResult:
        st = store.get()
        q, routes = quote_job(spec, st, prices.get(), route_profile, route_queues(st))  # routes: backend: auto
        if routes:
            context.log.info(
                "routes: "
                + "; ".join(f"{c.shard_id} -> {c.backend}/{c.model} ({c.reason})" for c in list(routes.values())[:20])
            )
        st.write_json(paths.quote, q.as_json())
        st.write_json(f"{paths.root}/quotes/quote-{q.created_at.replace(':', '')}.json", q.as_json())
        est = q.est_cost_usd
        context.log.info(
            f"quote: {q.pending_requests} requests, {format_usd(est.low)} / "
            f"{format_usd(est.expected)} / {format_usd(est.high)} (low/expected/high), budget "
            f"{format_budget(q.budget_usd)}"
        )
        return dg.MaterializeResult(metadata=quote_metadata(q))

    return quote


def quote_budget_check(frame: JobFrame) -> dg.AssetChecksDefinition:

    @dg.asset_check(
        asset=frame.key("quote"), blocking=True, description=check_description("quote_within_budget", frame.job)
    )
    def quote_within_budget(store: StoreResource) -> dg.AssetCheckResult:
        q = read_quote(store.get(), frame.job)
        return dg.AssetCheckResult(
            passed=q is not None and q.within_budget,
            metadata=plain(
                {"cost_high_usd": q.est_cost_usd.high if q else None, "budget_usd": q.budget_usd if q else None}
            ),
        )

    return quote_within_budget


def comparison_asset(frame: JobFrame) -> dg.AssetsDefinition:
    """``<job>/backend_comparison``, for a spec with ``cost_compare``: materialized with the manifest (the CLI's first
    step, the ``<job>_prepare`` job), so the graph has no asset that never runs."""
    spec, paths = frame.spec, frame.paths

    @dg.asset(**frame.asset_args("backend_comparison"))
    def backend_comparison(
        context: dg.AssetExecutionContext, store: StoreResource, prices: PricesResource
    ) -> dg.MaterializeResult:
        st = store.get()
        try:  # informational: a backend it cannot price is named, and the job goes on
            compare = spec.cost_compare or CostCompareSpec()
            rows = compare_backends(spec, st, prices.get(), compare, comparison_inputs(spec, st))
        except BatchPipelineError as exc:
            context.log.warning(f"backend comparison not made: {exc}")
            st.write_json(f"{paths.root}/backend_comparison.json", {"error": str(exc)})
            return dg.MaterializeResult(metadata={"comparison": dg.MetadataValue.text(f"not made: {exc}")})
        st.write_json(f"{paths.root}/backend_comparison.json", rows)
        return dg.MaterializeResult(metadata={"comparison": md_table(pl.DataFrame(rows), limit=20)})

    return backend_comparison
