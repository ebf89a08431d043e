"""What a routed job or a job with a fallback adds to the quote: each shard priced on the backend the router chose
for it (``core/route``), and the fallback allowance.

A routed quote is the plain quote (``quote.plain_quote``) of each group of shards on its chosen backend and model,
summed, with the route (every shard's choice, its reason and the cost of each candidate) beside it. The fallback
allowance is the fallback model's quote of the pending items times the share expected to reach it: the measured
share of tried items the primary handed over (on the canary first), or ``DEFAULT_FALLBACK_SHARE`` before anything
was tried. Both are bound to the job's own fingerprint, so ``verify_quote`` checks them like any quote.
"""

import polars as pl

from batch_pipeline.core.errors import ConfigError
from batch_pipeline.core.ledger.fallback import fallback_variant, handed_over
from batch_pipeline.core.ledger.reconcile import DEAD, VALID
from batch_pipeline.core.manifest.shards import Manifest
from batch_pipeline.core.money.pending import QuoteBasis
from batch_pipeline.core.money.quote import digest, plain_quote, quote_components, quote_price
from batch_pipeline.core.money.quote_record import FallbackPass, Levels, Quote, RouteGroup
from batch_pipeline.core.pricing.cost import PriceTable
from batch_pipeline.core.pricing.usd import usd_figure
from batch_pipeline.core.route.plan import RouteBook, candidate_for, routed_variant
from batch_pipeline.core.spec.job import AUTO_BACKEND, JobSpec

DEFAULT_FALLBACK_SHARE = 0.02  # items expected to reach the fallback before anything is measured
_SUMMED = (
    "requests",
    "input_tokens",
    "output_tokens_expected",
    "output_tokens_max",
    "cost_low",
    "cost_expected",
    "cost_high",
)


def fallback_share(states: pl.DataFrame | None) -> tuple[float, int]:
    """(share of tried items the primary handed over, items tried); the default before any item was tried."""
    if states is None or states.height == 0 or "attempts" not in states.columns:
        return DEFAULT_FALLBACK_SHARE, 0
    tried = states.filter(pl.col("attempts") > 0)
    if tried.height == 0:
        return DEFAULT_FALLBACK_SHARE, 0
    return float(handed_over(tried).sum()) / tried.height, tried.height


def extended_quote(spec: JobSpec, store, prices: PriceTable, basis: QuoteBasis) -> Quote:
    plain = spec.model_copy(update={"fallback": None})
    if spec.backend.name == AUTO_BACKEND:
        quote = _routed(plain, store, prices, basis)
    else:
        quote = plain_quote(plain, store, prices, basis)
    if spec.fallback is not None:
        quote = _add_fallback(spec, store, prices, quote, basis)
    components = quote_components(spec, Manifest(spec.name, store).last_generation(), quote_price(spec, prices), store)
    within = spec.budget_usd is None or quote.spent_usd + quote.est_cost_usd.high <= spec.budget_usd
    return quote.model_copy(
        update={
            "components": components,
            "fingerprint": digest(components),
            "backend": spec.backend.name,
            "model": spec.model,
            "within_budget": within,
        }
    )


def _routed(spec: JobSpec, store, prices: PriceTable, basis: QuoteBasis) -> Quote:
    manifest = Manifest(spec.name, store)
    items, states = basis.items, basis.states
    if items is None or "shard_id" not in items.columns:
        frame = pl.from_arrow(manifest.item_index(["request_id", "shard_id", "est_input_tokens"]))
        assert isinstance(frame, pl.DataFrame)
        items = frame if items is None else items.join(frame.select("request_id", "shard_id"), on="request_id")
    pending = items
    if states is not None and states.height:
        pending = items.join(
            states.filter(pl.col("state").is_in([VALID, DEAD])).select("request_id"), on="request_id", how="anti"
        )
    book = RouteBook(store, spec.name)
    groups: dict[tuple[str, str], list[str]] = {}
    route = []
    for shard_id in sorted(set(pending["shard_id"].unique().to_list())):
        choice = book.get(shard_id)
        if choice is None or choice.backend is None:
            raise ConfigError(
                f"job {spec.name}: shard {shard_id} has no route"
                + (
                    f" ({choice.reason})"
                    if choice
                    else "; route the shards first (the quote asset and `batch-pipeline quote` do)"
                )
            )
        groups.setdefault((choice.backend, choice.model or spec.model), []).append(shard_id)
        route.append(choice.as_dict())
    parts = {}
    for (backend, model), shards in sorted(groups.items()):
        cand = candidate_for(spec, book.get(shards[0]))  # type: ignore[arg-type]
        subset = items.filter(pl.col("shard_id").is_in(shards))
        parts[f"{backend}/{model}"] = (
            shards,
            plain_quote(routed_variant(spec, cand.backend, model), store, prices, basis.pricing(subset)),
        )
    if not parts:  # nothing pending: the first candidate's (empty) quote
        first = spec.route.candidates[0] if spec.route else None
        assert first is not None
        empty = plain_quote(routed_variant(spec, first.backend, first.model), store, prices, basis.pricing(items))
        return empty.model_copy(update={"route": [], "route_groups": {}})
    quotes = [q for _, q in parts.values()]
    base = max(quotes, key=lambda q: q.pending_requests)
    passes = {
        name: getattr(base.passes, name).model_copy(
            update={
                key: sum(getattr(getattr(q.passes, name), key) for q in quotes)
                for key in _SUMMED
                if key in type(getattr(base.passes, name)).model_fields
            }
        )
        for name in ("first", "probes", "retries")
    }
    return base.model_copy(
        update={
            "passes": base.passes.model_copy(update=passes),
            "est_cost_usd": Levels(
                **{k: usd_figure(sum(getattr(q.est_cost_usd, k) for q in quotes)) for k in ("low", "expected", "high")}
            ),
            "pending_requests": sum(q.pending_requests for q in quotes),
            "probe_requests": sum(q.probe_requests for q in quotes),
            "route": route,
            "route_groups": {
                label: RouteGroup(shards=len(shards), requests=q.pending_requests, est_cost_usd=q.est_cost_usd)
                for label, (shards, q) in parts.items()
            },
        }
    )


def _add_fallback(spec: JobSpec, store, prices: PriceTable, quote: Quote, basis: QuoteBasis) -> Quote:
    """``quote`` with the fallback's allowance as a pass of its own, and in its range."""
    fb = fallback_variant(spec).model_copy(update={"fallback": None, "route": None})
    share, tried = fallback_share(basis.states)
    fq = plain_quote(fb, store, prices, basis)
    first = fq.passes.first
    allowance = {k: getattr(first, f"cost_{k}") * share for k in ("low", "expected", "high")}
    fallback = FallbackPass(
        model=fb.model,
        backend=fb.backend.name,
        share=round(share, 4),
        measured_on=tried,
        requests_expected=round(fq.pending_requests * share, 1),
        # the fallback's own count of a request (its tokenizer, the prompt's prefix)
        input_tokens_per_request=round(first.input_tokens / max(fq.pending_requests, 1), 1),
        cost_low=allowance["low"],
        cost_expected=allowance["expected"],
        cost_high=allowance["high"],
    )
    est = quote.est_cost_usd
    return quote.model_copy(
        update={
            "passes": quote.passes.model_copy(update={"fallback": fallback}),
            "est_cost_usd": Levels(**{k: usd_figure(getattr(est, k) + allowance[k]) for k in allowance}),
        }
    )
