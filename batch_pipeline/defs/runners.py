"""The runners a shard asset drives: the job's backend (or each shard's routed one), the tail rescue and the
fallback model, each behind the budget guard, with the golden probes riding on the primary's submissions."""

from batch_pipeline.core.ledger.fallback import Stage, fallback_may_use_tail, fallback_tail_variant, fallback_variant
from batch_pipeline.core.ledger.result_parts import read_results
from batch_pipeline.core.manifest.shards import Manifest
from batch_pipeline.core.money.budget import BudgetGuard
from batch_pipeline.core.money.quote_record import read_quote
from batch_pipeline.core.quality.golden import GoldenProbes
from batch_pipeline.core.route.plan import RouteBook, candidate_for, routed_variant
from batch_pipeline.core.run.runner import ShardRunner
from batch_pipeline.core.spec.job import BackendSpec, JobSpec
from batch_pipeline.core.state.execute import ShardDriver, ShardWaits
from batch_pipeline.defs.resources import PricesResource, StoreResource
from batch_pipeline.executors.registry import batch_minimums, create_executor


def shard_runner(
    spec: JobSpec,
    store: StoreResource,
    prices: PricesResource,
    backend: BackendSpec | None = None,
    stage: Stage = Stage.PRIMARY,
) -> ShardRunner:
    """A shard runner whose every paid call first passes the budget guard (golden probes ride with the primary's
    submissions only)."""
    backend = backend or spec.backend
    st = store.get()
    executor = create_executor(backend)
    price = prices.get().lookup(backend.name, spec.model)
    quote = read_quote(st, spec.name)
    guard = BudgetGuard(
        spec, st, price, quote.calibration.factor if quote is not None else 1.0, batch=executor.pricing == "batch"
    )
    return ShardRunner(
        spec,
        st,
        executor,
        price,
        executor.pricing,
        before_spend=guard.check,
        extra_items=probe_hook(spec, st) if stage == Stage.PRIMARY else None,
        stage=stage,
    )


def executor_for(spec: JobSpec):
    """The executor a stored batch handle names, by backend name, from the job's sending backends (None: a backend
    the job no longer has); built only when asked (the sweep of provider leftovers, core/run/hygiene.py)."""
    backends = spec.sending_backends()
    return lambda name: create_executor(backends[name]) if name in backends else None


def probe_hook(spec: JobSpec, st):
    """Golden probes ride along with a shard's first real submission (all of them in the canary shard)."""
    probes = GoldenProbes(spec, st)
    if not probes.enabled:
        return None
    manifest = Manifest(spec.name, st)

    def extra(shard_id: str, attempt: int):
        shard_probes = probes.for_shard(
            shard_id,
            manifest.shard_items(shard_id, ["request_id"]).num_rows,
            canary=shard_id == manifest.canary_shard_id(),
        )
        answered = read_results(st, spec.name, shard_id, ["request_id"])
        if answered.join(shard_probes.select("request_id"), on="request_id", how="semi").height:
            return None
        return shard_probes.select("request_id", "user_prompt").to_arrow()

    return extra


def shard_driver(context, spec: JobSpec, store: StoreResource, prices: PricesResource) -> ShardDriver:
    """The shard runner and, on demand, the tail-rescue runner (the spec's online backend, interactive price) and
    the fallback model's runner."""
    tail = (lambda: shard_runner(spec, store, prices, spec.tail.backend)) if spec.tail is not None else None
    fallback = (
        (lambda: shard_runner(fallback_variant(spec), store, prices, stage=Stage.FALLBACK))
        if spec.fallback is not None
        else None
    )
    # the fallback's items below its backend's minimum per batch: the fallback model on the tail backend
    fallback_tail = (
        (lambda: shard_runner(fallback_tail_variant(spec), store, prices, stage=Stage.FALLBACK))
        if fallback_may_use_tail(spec)
        else None
    )
    minimums = batch_minimums(spec)
    if spec.route is not None:  # backend: auto: each shard's runner is built for the backend its route names
        book = RouteBook(store.get(), spec.name)

        def routed(shard_id: str) -> ShardRunner:
            choice = book.get(shard_id)
            if choice is None or choice.backend is None:
                raise ShardWaits(
                    f"shard {shard_id} has no route yet"
                    + (f": {choice.reason}" if choice else ": quote the job first (it routes the shards)")
                )
            return shard_runner(routed_variant(spec, candidate_for(spec, choice).backend, choice.model), store, prices)

        return ShardDriver(
            spec,
            store.get(),
            None,
            tail,
            say=context.log.info,
            fallback=fallback,
            router=routed,
            fallback_tail=fallback_tail,
            fallback_min_batch=minimums["fallback_min_batch"],
        )
    return ShardDriver(
        spec,
        store.get(),
        shard_runner(spec, store, prices),
        tail,
        say=context.log.info,
        fallback=fallback,
        fallback_tail=fallback_tail,
        fallback_min_batch=minimums["fallback_min_batch"],
    )
