"""Per job spec, the assets of DESIGN section 3, keyed ``<job>/<asset>``. Thin: the work is in core/."""

import base64
import time
from datetime import UTC, datetime

import dagster as dg
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

from batch_pipeline.core import progress
from batch_pipeline.core.errors import BatchPipelineError, SystemicError
from batch_pipeline.core.manifest.shards import Manifest, ShardCaps, build_manifest
from batch_pipeline.core.money.compare import compare_backends
from batch_pipeline.core.money.quote import make_quote, verify_quote
from batch_pipeline.core.money.usd import format_usd
from batch_pipeline.core.publish.plots import cost_over_time
from batch_pipeline.core.publish.report import build_report, shard_table
from batch_pipeline.core.publish.tables import JobState, dead_letters, promote, stage
from batch_pipeline.core.route.plan import route_pending
from batch_pipeline.core.run.hygiene import sweep_leftovers
from batch_pipeline.core.spec.job import CostCompareSpec, JobSpec
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.spec.settings import Settings
from batch_pipeline.core.state.execute import ShardWaits
from batch_pipeline.defs.checks import CHECKS, build_result_checks, build_shard_stats_check, check_description
from batch_pipeline.defs.k8s import GPU_POOL, gpu_step_tags, is_gpu_backend
from batch_pipeline.defs.metadata import (
    md_table,
    money_json,
    per_shard_meta,
    plain,
    progress_meta,
    provider_ceilings,
    spec_labels,
    table_meta,
)
from batch_pipeline.defs.resources import PricesResource, StoreResource
from batch_pipeline.defs.runners import executor_for, shard_driver
from batch_pipeline.executors.registry import account_pool, batch_limits, route_profile, route_queues

PASS_MONEY = ("cost_low", "cost_expected", "cost_high")  # the amounts of a quote's passes
SENDS = ("submit", "resolve", "rescue", "canary")  # what a shard's submit phase did when it moved
SHARDS_TAG = "batch_pipeline/shards"  # the shards a range run moves (the others in its range are left alone)


def shards_partitions(spec: JobSpec) -> dg.DynamicPartitionsDefinition:
    return dg.DynamicPartitionsDefinition(name=f"{spec.name}_shards")


def asset_key(spec: JobSpec, name: str) -> dg.AssetKey:
    return dg.AssetKey([spec.name, name])


def moving_shards(context: dg.AssetExecutionContext) -> list[str]:
    """The shards this run moves: its partition keys, or those of them its ``SHARDS_TAG`` names (a range run
    packed by ``shard_ranges`` leaves the other shards of its range to their own steps)."""
    keys = list(context.partition_keys)
    named = context.run.tags.get(SHARDS_TAG)
    if not named:
        return keys
    wanted = set(named.split(","))
    return [k for k in keys if k in wanted]


def _backfill_policy() -> dg.BackfillPolicy:
    """A UI backfill of the shards runs ``shards_per_run`` of them per run (each shard takes the driver's step)."""
    return dg.BackfillPolicy.multi_run(max_partitions_per_run=Settings.from_env().shards_per_run)


def _unpassed_checks(instance: dg.DagsterInstance, results_key: dg.AssetKey) -> list[str]:
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


def _clean_failure(call):
    """Our errors become a Dagster Failure whose description is the message a user needs (no traceback)."""
    try:
        return call()
    except BatchPipelineError as exc:
        raise dg.Failure(description=f"{type(exc).__name__}: {exc}") from exc


def build_job_assets(spec: JobSpec) -> tuple[list[dg.AssetsDefinition], list[dg.AssetChecksDefinition]]:
    job = spec.name
    shards = shards_partitions(spec)
    paths = JobPaths(job)
    # shard steps of self-hosted vLLM jobs hold a GPU: pod tags for the k8s executor, and the `gpu` pool
    step_opts = {"op_tags": gpu_step_tags(), "pool": GPU_POOL} if is_gpu_backend(spec.backend.name) else {}
    pool = account_pool(spec.backend)  # provider batch shard steps: one pool per provider account, across jobs
    step_opts = step_opts or ({"pool": pool} if pool else {})
    # a later pass of a multi-pass job reads its upstream's validated table: the chain shows in the asset graph
    upstream = [dg.AssetKey([spec.input.from_job, "validated"])] if spec.input.from_job else None
    labels = spec_labels(spec)  # the spec's owners and tags, on every asset of the job

    @dg.asset(
        key=asset_key(spec, "manifest"),
        deps=upstream,
        group_name=job,
        **labels,
        kinds={"parquet"},
        description=f"Every item of job {job}: request IDs, prompts, token estimates, shards; rejects. "
        "Fails when the input cannot be read at all (the message names the file or field): fix "
        "input in the spec, then `batch-pipeline run`. A bad row is not a failure: it is a "
        "reject (rejects_by_reason).",
    )
    def manifest(context: dg.AssetExecutionContext, store: StoreResource) -> dg.MaterializeResult:
        st = store.get()
        last = [time.monotonic()]

        def progress(source: str, rows: int) -> None:
            if time.monotonic() - last[0] > 10:
                last[0] = time.monotonic()
                context.log.info(f"manifest: {rows:,} rows read (now {source})")

        caps = ShardCaps.of(spec, *batch_limits(spec.backend.name))
        from batch_pipeline.core.manifest.parts import FileParts

        parts = FileParts(spec, st)  # files prepared in their own steps (defs/manifest_parts.py), if any
        # a bad input (an upstream filter naming no column, say) is its message, not a traceback
        summary = _clean_failure(lambda: build_manifest(spec, st, progress=progress, caps=caps, parts=parts))
        parts.discard_used()
        known = set(context.instance.get_dynamic_partitions(shards.name))
        missing = [s for s in Manifest(job, st).shard_ids() if s not in known]  # new ones, or a fresh instance
        if missing:
            context.instance.add_dynamic_partitions(shards.name, missing)
        rejects = pl.from_arrow(Manifest(job, st).rejects())
        context.log.info(
            f"manifest gen {summary.generation}: files {summary.files_line()}; {summary.input_rows} rows "
            f"read, {summary.rejected_rows} rejected, {summary.new_requests} new requests in "
            f"{len(summary.new_shards)} new shards"
        )
        meta = plain(
            {k: v for k, v in summary.as_dict().items() if k not in ("new_shards", "rejects_by_reason", "files")}
        )
        meta["input_files_by_action"] = dg.MetadataValue.text(summary.files_line())
        meta["input_files_detail"] = dg.MetadataValue.json(summary.files)
        meta["new_shards"] = dg.MetadataValue.text(", ".join(summary.new_shards) or "none")
        meta["rejects_by_reason"] = dg.MetadataValue.json(summary.rejects_by_reason)
        meta["rejects_preview"] = md_table(rejects.select("source", "line", "field", "reason"))
        meta["items_dir"] = dg.MetadataValue.path(st.uri(f"{paths.root}/manifest/items"))
        return dg.MaterializeResult(metadata=meta)

    @dg.asset(
        key=asset_key(spec, "quote"),
        deps=[manifest],
        group_name=job,
        **labels,
        kinds={"python"},
        description="The remaining work priced before any spend: a low/expected/high range per pass, "
        "calibrated on measured usage, bound to a fingerprint of its inputs, expiring after 30 "
        "minutes. Fails on a model with no price row (add it to data/prices.yaml); its "
        "check quote_within_budget holds every submission while the high estimate passes "
        "budget_usd.",
    )
    def quote(context: dg.AssetExecutionContext, store: StoreResource, prices: PricesResource) -> dg.MaterializeResult:
        st = store.get()
        state = JobState.load(spec, st)
        routes = route_pending(
            spec,
            st,
            prices.get(),
            route_profile,
            state.items,
            state.states,  # backend: auto
            queues=route_queues(st),
        )
        q = make_quote(spec, st, prices.get(), state.items, state.results, state.states)
        if routes:
            context.log.info(
                "routes: "
                + "; ".join(f"{c.shard_id} -> {c.backend}/{c.model} ({c.reason})" for c in list(routes.values())[:20])
            )
        st.write_json(paths.quote, q)
        st.write_json(f"{paths.root}/quotes/quote-{q['created_at'].replace(':', '')}.json", q)
        est = q["est_cost_usd"]
        context.log.info(
            f"quote: {q['pending_requests']} requests, {format_usd(est['low'])} / "
            f"{format_usd(est['expected'])} / {format_usd(est['high'])} (low/expected/high), budget "
            f"{format_usd(q['budget_usd'])}"
        )
        meta = plain(
            {
                "pending_requests": q["pending_requests"],
                "cost_low_usd": est["low"],
                "cost_expected_usd": est["expected"],
                "cost_high_usd": est["high"],
                "budget_usd": q["budget_usd"],
                "within_budget": q["within_budget"],
                "calibration": q["calibration"]["factor"],
                "fingerprint": q["fingerprint"][:16],
                "expires_at": q["expires_at"],
            }
        )
        meta["passes"] = dg.MetadataValue.json(money_json(q["passes"], money_keys=PASS_MONEY))  # dollars as dollars
        if q.get("route"):
            meta["route"] = md_table(
                pl.DataFrame(
                    [
                        {k: v for k, v in r.items() if k in ("shard_id", "backend", "model", "rule", "reason")}
                        for r in q["route"]
                    ]
                ),
                limit=50,
            )
        meta["cache_hit_share"] = dg.MetadataValue.json(q["cache_hit_share"])
        return dg.MaterializeResult(metadata=meta)

    @dg.asset_check(asset=quote, blocking=True, description=check_description("quote_within_budget", job))
    def quote_within_budget(store: StoreResource) -> dg.AssetCheckResult:
        q = store.get().read_json(paths.quote) or {}
        return dg.AssetCheckResult(
            passed=bool(q.get("within_budget")),
            metadata=plain(
                {"cost_high_usd": (q.get("est_cost_usd") or {}).get("high"), "budget_usd": q.get("budget_usd")}
            ),
        )

    @dg.asset(
        key=asset_key(spec, "submissions"),
        deps=[quote],
        partitions_def=shards,
        group_name=job,
        **labels,
        backfill_policy=_backfill_policy(),
        **step_opts,
        kinds={"python"},
        description="Submit each shard's pending items (re-attach to an open batch); "
        "self-hosted and online backends run the shard inline. A failure is "
        "a job stop (bad key, budget, canary, retry cap: the message says "
        "which and what fixes it, then `batch-pipeline resume`) or a shard "
        "that must wait (ShardWaits: the canary, a stale quote).",
    )
    def submissions(
        context: dg.AssetExecutionContext, store: StoreResource, prices: PricesResource
    ) -> dg.MaterializeResult:
        st = store.get()
        _clean_failure(lambda: verify_quote(spec, st, prices.get(), st.read_json(paths.quote)))
        driver = shard_driver(context, spec, store, prices)
        sent, batches = 0, []
        counts: dict[str, dict[str, int]] = {}
        waits: dict[str, str] = {}
        engine_metrics: dict = {}
        keys = moving_shards(context)
        shards_meter = progress.meter("submit", total=len(keys), unit="shards")
        for key in keys:  # each shard does what the driver's plan says for it
            try:
                out = driver.submit_phase(key)
            except ShardWaits as exc:
                if len(keys) == 1:  # asked for this shard alone: say why it cannot move
                    raise dg.Failure(description=f"ShardWaits: {exc}") from exc
                context.log.warning(f"{exc}: skipped in this run")
                continue
            except BatchPipelineError as exc:
                raise dg.Failure(description=f"{type(exc).__name__}: {exc}") from exc
            if out.action in SENDS:  # the bar counts shards that moved, not those that waited or were settled
                shards_meter.advance()
            if out.batches:  # a batch made (or re-attached) now: one more for this pass to collect
                progress.expect("collect", len(out.batches))
            sent += out.sent
            counts[key] = {"requests_sent": out.sent}
            batches.extend(out.batches)
            if out.action == "wait" and out.notes:  # e.g. quota: the account's queue has no room for it now
                waits[key] = "; ".join(out.notes)
            context.log.info(
                f"shard {key}: {out.action}: {out.sent} requests sent"
                + (f", {out.rescued} rescued online" if out.rescued else "")
                + (f" ({'; '.join(out.notes)})" if out.notes else "")
            )
            engine = getattr(driver.runner.executor, "metrics", {}).get(key)
            if engine:
                engine_metrics[key] = engine
        meta = {
            **(per_shard_meta(counts) if counts else {"requests_sent": dg.MetadataValue.int(sent)}),
            "batches": dg.MetadataValue.text("\n".join(batches) or "none"),
            **progress_meta(shards_meter),
        }
        if waits:  # why shards of this run sent nothing (the figures of a full queue, a batch still open)
            meta["waiting"] = dg.MetadataValue.md("\n".join(f"- {k}: {why}" for k, why in sorted(waits.items())))
        if engine_metrics:  # self-hosted: prompt/cached/generated tokens, tokens/s, engine vs wall time
            meta["engine_metrics"] = dg.MetadataValue.json(engine_metrics)
        return dg.MaterializeResult(metadata=meta)

    @dg.asset(
        key=asset_key(spec, "shard_results"),
        deps=[submissions],
        partitions_def=shards,
        group_name=job,
        **labels,
        backfill_policy=_backfill_policy(),
        **step_opts,
        kinds={"parquet"},
        description="Collect each shard's ended batches; validate and append results; "
        "rescue the tail online near the deadline or after an expiry. Fails "
        "when the provider failed a batch or refused the job (a job stop: "
        "`batch-pipeline status` shows why; fix it, then `batch-pipeline "
        "resume`); the other shards' ended batches are still collected.",
    )
    def shard_results(
        context: dg.AssetExecutionContext, store: StoreResource, prices: PricesResource
    ) -> dg.MaterializeResult:
        driver = shard_driver(context, spec, store, prices)
        if driver.stream and spec.fallback is None:  # a stream backend wrote its results while the shard ran; a
            # fallback may still hold a batch of the shard (a stream primary with a batch fallback): it is collected
            return dg.MaterializeResult(metadata={"results": dg.MetadataValue.text("written while the shard ran")})
        last_log = [0.0]

        def on_status(shard_id, status):
            if time.monotonic() - last_log[0] > 10:
                last_log[0] = time.monotonic()
                context.log.info(
                    f"shard {shard_id}: {status.provider_status} "
                    f"{status.completed}/{status.total} done, {status.failed} failed"
                )

        counts: dict[str, dict[str, int]] = {}
        systemic: list[str] = []
        keys = moving_shards(context)
        shards_meter = progress.meter("collect", total=len(keys), unit="shards")
        for key in keys:
            try:  # a failed batch stops the job, but the other shards' ended batches are still collected
                out = driver.collect_phase(key, on_status=on_status)
            except SystemicError as exc:
                systemic.append(str(exc))
                shards_meter.advance()  # collected, and the batch's failure stops the job
                continue
            if out.collected:  # a stream shard, or one with no open batch, collects nothing: no count
                shards_meter.advance()
            counts[key] = {"results": out.results, "succeeded": out.succeeded, "rescued_online": out.rescued}
            context.log.info(f"shard {key}: collected {out.results} results, {out.succeeded} succeeded")
        if systemic:  # one message for the job: the first cause, and how many other shards it stopped
            more = f" (and {len(systemic) - 1} more shard(s) stopped by the same stop)" if len(systemic) > 1 else ""
            raise dg.Failure(description=f"SystemicError: {systemic[0]}{more}")
        return dg.MaterializeResult(metadata={**per_shard_meta(counts), **progress_meta(shards_meter)})

    @dg.asset(
        key=asset_key(spec, "results"),
        deps=[shard_results],
        group_name=job,
        **labels,
        kinds={"parquet"},
        description="The staged table: one row per source row, latest valid result of its request. "
        "The blocking checks run on it; users read the promoted copy, validated. A failed check "
        "here keeps the previous validated table: each check's description says what it means "
        "and what fixes it (README, Troubleshooting).",
    )
    def results(context: dg.AssetExecutionContext, store: StoreResource) -> dg.MaterializeResult:
        st = store.get()
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

    @dg.asset(
        key=asset_key(spec, "validated"),
        deps=[results],
        group_name=job,
        **labels,
        kinds={"parquet", "duckdb"},
        description="The validated table users read (Parquet + DuckDB views): the staged table, promoted "
        "only when every blocking check on results passed. Skipped or failed when one did not "
        "pass: the previous table stays; fix what the failed check names, then run again.",
    )
    def validated(context: dg.AssetExecutionContext, store: StoreResource) -> dg.MaterializeResult:
        st = store.get()
        unpassed = _unpassed_checks(context.instance, results.key)
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

    @dg.asset(
        key=asset_key(spec, "dead_letters"),
        deps=[validated],
        group_name=job,
        **labels,
        kinds={"parquet"},
        description="Items whose retry budget is spent, with their last error code and message. "
        f"After a fix, `batch-pipeline replay {job} --code CODE` gives them a fresh budget "
        "(e.g. --code truncated --max-tokens N).",
    )
    def dead_letters_asset(context: dg.AssetExecutionContext, store: StoreResource) -> dg.MaterializeResult:
        st = store.get()
        dead = dead_letters(JobState.load(spec, st))
        return dg.MaterializeResult(
            metadata={
                "count": dg.MetadataValue.int(dead.height),
                "preview": md_table(dead.select("request_id", "failures", "last_error_code", "last_error")),
                **table_meta(dead.schema, dead.height),
            }
        )

    @dg.asset(
        key=asset_key(spec, "report"),
        deps=[validated, dead_letters_asset],
        group_name=job,
        **labels,
        kinds={"python"},
        description="Counts, tokens, cost per accepted item, quoted vs actual spend, "
        "per-shard reconciliation. complete false means items are still "
        f"pending: `batch-pipeline status {job}` says why they wait.",
    )
    def report(context: dg.AssetExecutionContext, store: StoreResource) -> dg.MaterializeResult:
        st = store.get()
        state = JobState.load(spec, st)
        rep = build_report(
            spec,
            st,
            state,
            outputs={"validated": st.uri(paths.validated), "duckdb": str(st.local_path(paths.duckdb) or "")},
        )
        rep.update(provider_ceilings(spec, st))  # open batches against their window and retention; held shards
        # when this publish ended, and of which manifest: `status` says the job is done (and when) from these
        rep["published_at"] = datetime.now(UTC).isoformat()
        rep["manifest_generation"] = Manifest(job, st).last_generation()
        st.write_json(paths.report, rep)
        png = cost_over_time(state.scan.timeline)  # summed per recording time by the streaming scan
        st.write_bytes(f"{paths.root}/report.png", png)
        meta = plain({k: v for k, v in rep.items() if not isinstance(v, dict | list)})
        for key in ("cost_by_pricing", "quoted_vs_actual", "cost_by_attempt"):  # amounts as dollars
            meta[key] = dg.MetadataValue.json(
                money_json(rep.get(key) or {}, money=key.startswith("cost_"), money_keys=("first_pass", "retries"))
            )
        if rep.get("golden_accuracy_by_shard"):
            meta["golden_accuracy_by_shard"] = md_table(pl.DataFrame(rep["golden_accuracy_by_shard"]), limit=50)
        meta["plot"] = dg.MetadataValue.md(f"![spend](data:image/png;base64,{base64.b64encode(png).decode()})")
        meta["plot_path"] = dg.MetadataValue.path(st.uri(f"{paths.root}/report.png"))
        meta["shards"] = md_table(pl.DataFrame(shard_table(state)), limit=50)
        if rep["open_batches"] or rep["held_shards"]:
            meta["open_batches"] = dg.MetadataValue.json(rep["open_batches"])
            meta["held_shards"] = dg.MetadataValue.json(rep["held_shards"])
        return dg.MaterializeResult(metadata=meta)

    assets = [manifest, quote, submissions, shard_results, results, validated, dead_letters_asset, report]
    if spec.cost_compare is not None:  # only a job that asks for a comparison has one; it runs with the manifest
        assets.append(comparison_asset(spec, manifest))
    return assets, [quote_within_budget, build_result_checks(spec, results), build_shard_stats_check(spec, results)]


def comparison_asset(spec: JobSpec, manifest: dg.AssetsDefinition) -> dg.AssetsDefinition:
    """``<job>/backend_comparison``, for a spec with ``cost_compare``: materialized with the manifest (the CLI's first
    step, the ``<job>_prepare`` job), so the graph has no asset that never runs."""
    paths = JobPaths(spec.name)

    @dg.asset(
        key=asset_key(spec, "backend_comparison"),
        deps=[manifest],
        group_name=spec.name,
        **spec_labels(spec),
        kinds={"python"},
        description="The remaining work's request plan quoted on every backend of cost_compare, and the "
        "self-hosted break-even utilisation; made with the manifest, before anything is spent "
        "(`batch-pipeline quote --compare` prices the whole job too). A backend or model with no "
        "price row is named in its metadata (add it to data/prices.yaml or drop it from "
        "cost_compare); the job goes on.",
    )
    def backend_comparison(
        context: dg.AssetExecutionContext, store: StoreResource, prices: PricesResource
    ) -> dg.MaterializeResult:
        st = store.get()
        state = JobState.load(spec, st)
        try:  # informational: a backend it cannot price is named, and the job goes on
            rows = compare_backends(
                spec, st, prices.get(), spec.cost_compare or CostCompareSpec(), state.items, state.results, state.states
            )
        except BatchPipelineError as exc:
            context.log.warning(f"backend comparison not made: {exc}")
            st.write_json(f"{paths.root}/backend_comparison.json", {"error": str(exc)})
            return dg.MaterializeResult(metadata={"comparison": dg.MetadataValue.text(f"not made: {exc}")})
        st.write_json(f"{paths.root}/backend_comparison.json", rows)
        return dg.MaterializeResult(metadata={"comparison": md_table(pl.DataFrame(rows), limit=20)})

    return backend_comparison
