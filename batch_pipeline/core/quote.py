"""The quote: the job's remaining work priced before any spend, bound to a fingerprint of its inputs.

This is the plain estimate (estimated input tokens x price + max_tokens x price, per pending item);
the range, cache-hit share and per-pass breakdown come with the cost-governance work.
"""

import hashlib
import json
from datetime import UTC, datetime, timedelta

import polars as pl

from batch_pipeline.core.cost import PriceTable
from batch_pipeline.core.manifest import Manifest
from batch_pipeline.core.reconcile import DEAD, VALID
from batch_pipeline.core.spec import JobSpec
from batch_pipeline.core.store import Store

QUOTE_TTL = timedelta(minutes=30)


def fingerprint(spec: JobSpec, manifest_generation: int, prices: PriceTable) -> str:
    payload = {"spec": spec.model_dump(mode="json"), "generation": manifest_generation,
               "price": prices.lookup(spec.backend.name, spec.model).model_dump(mode="json")}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def make_quote(spec: JobSpec, store: Store, prices: PriceTable, states: pl.DataFrame | None = None) -> dict:
    price = prices.lookup(spec.backend.name, spec.model)
    manifest = Manifest(spec.name, store)
    items = pl.from_arrow(manifest.item_index(["request_id", "est_input_tokens"]))
    assert isinstance(items, pl.DataFrame)
    if states is not None and states.height:
        done = states.filter(pl.col("state").is_in([VALID, DEAD])).select("request_id")
        items = items.join(done, on="request_id", how="anti")
    n = items.height
    input_tokens = int(items["est_input_tokens"].sum() or 0) if n else 0
    output_tokens = n * spec.sampling.max_tokens
    cost = price.cost(input_tokens, output_tokens, batch=True)
    now = datetime.now(UTC)
    return {
        "job": spec.name,
        "model": spec.model,
        "backend": spec.backend.name,
        "pending_requests": n,
        "est_input_tokens": input_tokens,
        "max_output_tokens": output_tokens,
        "price": price.model_dump(mode="json"),
        "est_cost_usd": round(cost, 6),
        "budget_usd": spec.budget_usd,
        "within_budget": spec.budget_usd is None or cost <= spec.budget_usd,
        "fingerprint": fingerprint(spec, manifest.last_generation(), prices),
        "created_at": now.isoformat(),
        "expires_at": (now + QUOTE_TTL).isoformat(),
    }
