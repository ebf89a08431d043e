"""The shard assets of one job, partitioned by shard: ``submissions`` (each shard does what the driver's plan says:
submit, resolve, rescue, the canary, or wait) and ``shard_results`` (collect the ended batches)."""

import time
from collections.abc import Callable
from functools import partial

import dagster as dg

from batch_pipeline.core import progress
from batch_pipeline.core.errors import BatchPipelineError, SystemicError
from batch_pipeline.core.money.quote import verify_quote
from batch_pipeline.core.money.quote_record import read_quote
from batch_pipeline.core.settings import COLLECT_SHARDS_AT_ONCE
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.state.execute import ShardWaits
from batch_pipeline.defs.frame import JobFrame, clean_failure, moving_shards
from batch_pipeline.defs.metadata import per_shard_meta, progress_meta
from batch_pipeline.defs.resources import PricesResource, StoreResource
from batch_pipeline.defs.runners import shard_driver

SENDS = ("submit", "resolve", "rescue", "canary")  # what a shard's submit phase did when it moved


class SubmitTally:
    """What one submissions run did, shard by shard: requests sent, batches made, why shards waited."""

    def __init__(self, keys: list[str]) -> None:
        self.sent = 0
        self.batches: list[str] = []
        self.counts: dict[str, dict[str, int]] = {}
        self.waits: dict[str, str] = {}
        self.engine_metrics: dict = {}
        self.meter = progress.meter("submit", total=len(keys), unit="shards")

    def add(self, key: str, out, engine: dict | None) -> None:
        if out.action in SENDS:  # the bar counts shards that moved, not those that waited or were settled
            self.meter.advance()
        if out.batches:  # a batch made (or re-attached) now: one more for this pass to collect
            progress.expect("collect", len(out.batches))
        self.sent += out.sent
        self.counts[key] = {"requests_sent": out.sent}
        self.batches.extend(out.batches)
        if out.action == "wait" and out.notes:  # e.g. quota: the account's queue has no room for it now
            self.waits[key] = "; ".join(out.notes)
        if engine:
            self.engine_metrics[key] = engine

    def metadata(self) -> dict:
        meta = {
            **(per_shard_meta(self.counts) if self.counts else {"requests_sent": dg.MetadataValue.int(self.sent)}),
            "batches": dg.MetadataValue.text("\n".join(self.batches) or "none"),
            **progress_meta(self.meter),
        }
        if self.waits:  # why shards of this run sent nothing (the figures of a full queue, a batch still open)
            meta["waiting"] = dg.MetadataValue.md("\n".join(f"- {k}: {why}" for k, why in sorted(self.waits.items())))
        if self.engine_metrics:  # self-hosted: prompt/cached/generated tokens, tokens/s, engine vs wall time
            meta["engine_metrics"] = dg.MetadataValue.json(self.engine_metrics)
        return meta


ShardStepBody = Callable[[JobSpec, dg.AssetExecutionContext, StoreResource, PricesResource], dg.MaterializeResult]


def shard_step(frame: JobFrame, name: str, body: ShardStepBody) -> dg.AssetsDefinition:
    """``<job>/<name>``, one step per shard: ``body`` does the work of the shards the run moves."""
    spec = frame.spec

    @dg.asset(**frame.asset_args(name))
    def step(context: dg.AssetExecutionContext, store: StoreResource, prices: PricesResource) -> dg.MaterializeResult:
        return body(spec, context, store, prices)

    return step


def submit_shards(
    spec: JobSpec, context: dg.AssetExecutionContext, store: StoreResource, prices: PricesResource
) -> dg.MaterializeResult:
    """Each shard does what the driver's plan says for it."""
    st = store.get()
    clean_failure(lambda: verify_quote(spec, st, prices.get(), read_quote(st, spec.name)))
    driver = shard_driver(context, spec, store, prices)
    keys = moving_shards(context)
    tally = SubmitTally(keys)
    for key in keys:
        try:
            out = driver.submit_phase(key)
        except ShardWaits as exc:
            if len(keys) == 1:  # asked for this shard alone: say why it cannot move
                raise dg.Failure(description=f"ShardWaits: {exc}") from exc
            context.log.warning(f"{exc}: skipped in this run")
            continue
        except BatchPipelineError as exc:
            raise dg.Failure(description=f"{type(exc).__name__}: {exc}") from exc
        tally.add(key, out, getattr(driver.runner.executor, "metrics", {}).get(key))
        context.log.info(
            f"shard {key}: {out.action}: {out.sent} requests sent"
            + (f", {out.rescued} rescued online" if out.rescued else "")
            + (f" ({'; '.join(out.notes)})" if out.notes else "")
        )
    return dg.MaterializeResult(metadata=tally.metadata())


def collect_shards(
    spec: JobSpec,
    context: dg.AssetExecutionContext,
    store: StoreResource,
    prices: PricesResource,
    at_once: int = COLLECT_SHARDS_AT_ONCE,
) -> dg.MaterializeResult:
    """Collect each shard's ended batches, ``at_once`` shards at a time (``Settings.collect_shards_at_once``)."""
    driver = shard_driver(context, spec, store, prices)
    if driver.stream and spec.fallback is None:  # a stream backend wrote its results while the shard ran; a
        # fallback may still hold a batch of the shard (a stream primary with a batch fallback): it is collected
        return dg.MaterializeResult(metadata={"results": dg.MetadataValue.text("written while the shard ran")})
    last_log = [0.0]

    def on_status(shard_id, status):
        if time.monotonic() - last_log[0] > 10:
            last_log[0] = time.monotonic()
            context.log.info(
                f"shard {shard_id}: {status.provider_status} {status.completed}/{status.total} done, {status.failed} failed"
            )

    counts: dict[str, dict[str, int]] = {}
    systemic: list[str] = []
    keys = moving_shards(context)
    shards_meter = progress.meter("collect", total=len(keys), unit="shards")
    # a failed batch stops the job, but the other shards' ended batches are still collected
    for key, out in driver.collect_phases(keys, on_status=on_status, at_once=at_once):
        if isinstance(out, SystemicError):
            systemic.append(str(out))
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


def submissions_asset(frame: JobFrame) -> dg.AssetsDefinition:
    return shard_step(frame, "submissions", submit_shards)


def shard_results_asset(frame: JobFrame) -> dg.AssetsDefinition:
    return shard_step(frame, "shard_results", partial(collect_shards, at_once=frame.settings.collect_shards_at_once))
