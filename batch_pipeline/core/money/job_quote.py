"""A job's quote: the plain quote (``quote.plain_quote``), or for a routed job or one with a fallback the quote that
prices each shard on its chosen backend and adds the fallback's allowance (``allowance.extended_quote``).

``store_quote`` makes it from the store without reading every item of the job: the results (the columns a quote
reads; golden probe rows apart, as ``publish.tables.JobState`` keeps them) and the states of the items of the shards
that have results (every other item is pending); the pending work then comes from the manifest's per-shard totals
(``pending.PendingWork.from_totals``). It is the quote ``make_quote`` gives from ``JobState``'s whole frames, field
for field (``test_quote_totals``).
"""

import polars as pl

from batch_pipeline.core.ledger.reconcile import item_states
from batch_pipeline.core.ledger.replay import Replays
from batch_pipeline.core.ledger.result_parts import read_results
from batch_pipeline.core.manifest.shards import Manifest
from batch_pipeline.core.money.allowance import extended_quote
from batch_pipeline.core.money.pending import NOTHING_DONE, QuoteBasis
from batch_pipeline.core.money.quote import plain_quote
from batch_pipeline.core.money.quote_record import Quote
from batch_pipeline.core.pricing.cost import PriceTable
from batch_pipeline.core.quality.golden import GoldenProbes
from batch_pipeline.core.spec.job import AUTO_BACKEND, JobSpec
from batch_pipeline.core.store import Store

# what a quote reads of the results: the states' columns (reconcile.item_states), the measured tokens and the spend
QUOTE_RESULT_COLUMNS = [
    "request_id",
    "shard_id",
    "attempt",
    "status",
    "error_class",
    "error_code",
    "error_message",
    "model",
    "backend",
    "input_tokens",
    "cached_tokens",
    "cache_write_tokens",
    "output_tokens",
    "cost_usd",
]


def make_quote(spec: JobSpec, store, prices: PriceTable, basis: QuoteBasis = NOTHING_DONE) -> Quote:
    """What the job's pending items are expected to cost, low to high, bound to the inputs it was made from
    (``basis``: the items priced, their results and states)."""
    if spec.backend.name == AUTO_BACKEND or spec.fallback is not None:  # routed shards, a fallback allowance
        return extended_quote(spec, store, prices, basis)
    return plain_quote(spec, store, prices, basis)


def quote_inputs(spec: JobSpec, store: Store) -> QuoteBasis:
    """The results and states a quote is made from, read without every item (the items priced: the job's own,
    from the manifest's totals): every result row of the job's items
    (``QUOTE_RESULT_COLUMNS``; golden probe rows left out) and the states of the items of the shards that have
    results, which are every item with a state other than pending."""
    results = read_results(store, spec.name, columns=QUOTE_RESULT_COLUMNS)
    if spec.quality is not None and results.height:
        probes = GoldenProbes(spec, store).all_probe_ids().select("request_id")
        if probes.height:
            results = results.join(probes, on="request_id", how="anti")
    manifest = Manifest(spec.name, store)
    known = set(manifest.shard_ids())
    shards = sorted(s for s in results["shard_id"].unique().to_list() if s in known) if results.height else []
    items = pl.from_arrow(manifest.items_of(shards, ["request_id", "shard_id"]))
    assert isinstance(items, pl.DataFrame)
    return QuoteBasis(None, results, item_states(items, results, spec.retries, Replays(store, spec.name).table()))


def store_quote(spec: JobSpec, store: Store, prices: PriceTable) -> Quote:
    """The job's quote from the store (``quote_inputs``): the pending work from the manifest's per-shard totals."""
    return make_quote(spec, store, prices, quote_inputs(spec, store))
