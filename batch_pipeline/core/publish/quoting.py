"""A job's quote as the quote asset and ``batch-pipeline quote`` make it, and the backend comparison's inputs.

A routed job (``backend: auto``) is routed first, over its items, then quoted from them. Any other job is quoted
from the manifest's per-shard totals and the results of the shards that have some (``money/job_quote.py``), so a
re-quote of a large job with little done reads no per-item table. It lives here, at the top of core, because
routing reads the job's whole state (``JobState``).
"""

from batch_pipeline.core.money.job_quote import make_quote, quote_inputs, store_quote
from batch_pipeline.core.money.pending import QuoteBasis
from batch_pipeline.core.money.quote_record import Quote
from batch_pipeline.core.pricing.cost import PriceTable
from batch_pipeline.core.publish.tables import JobState
from batch_pipeline.core.route.plan import Profile, Queues, route_pending
from batch_pipeline.core.route.rules import RouteChoice
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.store import Store


def quote_job(
    spec: JobSpec, store: Store, prices: PriceTable, profile: Profile, queues: Queues | None = None
) -> tuple[Quote, dict[str, RouteChoice]]:
    """The job's quote, and the routes chosen on the way (none for a job that is not routed)."""
    if spec.route is None:
        return store_quote(spec, store, prices), {}
    state = JobState.load(spec, store)
    routes = route_pending(spec, store, prices, profile, state.items, state.states, queues=queues)
    return make_quote(spec, store, prices, state.quote_basis()), routes


def comparison_inputs(spec: JobSpec, store: Store) -> QuoteBasis:
    """What ``compare_backends`` prices: no item table unless the job is routed (the manifest's totals price the
    rest)."""
    if spec.route is not None:
        return JobState.load(spec, store).quote_basis()
    return quote_inputs(spec, store)
