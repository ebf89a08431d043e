"""A job's quote: the plain quote (``quote.plain_quote``), or for a routed job or one with a fallback the quote that
prices each shard on its chosen backend and adds the fallback's allowance (``allowance.extended_quote``)."""

import polars as pl

from batch_pipeline.core.money.allowance import extended_quote
from batch_pipeline.core.money.quote import plain_quote
from batch_pipeline.core.money.quote_record import Quote
from batch_pipeline.core.pricing.cost import PriceTable
from batch_pipeline.core.spec.job import AUTO_BACKEND, JobSpec


def make_quote(
    spec: JobSpec,
    store,
    prices: PriceTable,
    items: pl.DataFrame | None = None,
    results: pl.DataFrame | None = None,
    states: pl.DataFrame | None = None,
) -> Quote:
    """What the job's pending items are expected to cost, low to high, bound to the inputs it was made from."""
    if spec.backend.name == AUTO_BACKEND or spec.fallback is not None:  # routed shards, a fallback allowance
        return extended_quote(spec, store, prices, items, results, states)
    return plain_quote(spec, store, prices, items, results, states)
