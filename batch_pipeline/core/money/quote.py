"""The quote: the job's remaining work priced before any spend, as a range, bound to its inputs.

Priced from the real request plan: every pending item's rendered prompt with the system prompt and
the output schema counted per request (as the provider bills them) by the model family's tokenizer
(``core/money/estimate.py``: o200k for OpenAI, the model's tokenizer.json for open models, the documented density
for Claude and Gemini), output tokens from ``max_tokens`` (or, once results exist, their measured mean), a cache
range (low / expected / high) and each pass apart (first pass, golden probes, expected retries). Token estimates
are calibrated against measured usage as soon as any results exist (``calibration.tokenizer_factor``; ``factor``
is the same against the manifest's bytes / 4 estimate, which the budget guard scales). A quote is bound to a SHA-256 fingerprint of its inputs and expires; a
changed or expired quote is refused at submission with a message that says what changed.

Cache: the shared prefix (the system prompt) is read from the provider's cache at the cache rate. Where the
provider bills cache writes (``Price.cache_ttl``: Anthropic, whose breakpoint on the system block caches the
tools, i.e. the output schema, and the system prompt), every request that does not read the prefix writes it at
``cache_write_multiplier`` x the input rate: at best only the first request of each batch (one per shard with
pending items, and the canary's own batch) writes it and every other reads it; as expected, half read, the rest
write (or the measured read and write shares once results exist); at worst every request writes it.

Golden probes (``core/quality/golden.py``) are paid requests but not items: those that will ride along with each
pending shard's next submission are priced in their own pass (``passes.probes``, ``probe_requests``), from
their rendered prompts, and are not retried.
"""

import hashlib
import json
import math
from datetime import UTC, datetime, timedelta

import polars as pl

from batch_pipeline.core.errors import ConfigError
from batch_pipeline.core.ledger.result_parts import read_results
from batch_pipeline.core.manifest.shards import Manifest
from batch_pipeline.core.manifest.upstream import job_inputs
from batch_pipeline.core.money.estimate import (
    RequestTokens,
    measured_ratio,
    request_tokens,
    sample_shards,
    token_calibration,
)
from batch_pipeline.core.money.pass_cost import PassPricing, probe_pass, retry_pass
from batch_pipeline.core.money.passes import cascade_quote
from batch_pipeline.core.money.pending import NOTHING_DONE, PendingWork, QuoteBasis
from batch_pipeline.core.money.quote_record import (
    CacheTerms,
    Calibration,
    Levels,
    PassCost,
    ProbePass,
    Quote,
    QuotePasses,
    RetryPass,
)
from batch_pipeline.core.pricing.cost import (
    BYTES_PER_TOKEN,
    Price,
    PriceTable,
    estimate_request_tokens,
)
from batch_pipeline.core.pricing.tokenizers import counter_for
from batch_pipeline.core.pricing.usd import format_usd, usd_figure
from batch_pipeline.core.quality.golden import GoldenProbes, canary_passed
from batch_pipeline.core.spec.contract_floor import choice_schema
from batch_pipeline.core.spec.job import AUTO_BACKEND, JobSpec

QUOTE_TTL = timedelta(minutes=30)
QUOTE_MARGIN = timedelta(minutes=2)  # a quote this close to expiry is re-made before spending on it


class QuoteRefused(ConfigError):
    """No spend without a current quote: missing, expired, changed, or over budget."""


def digest(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def quote_components(spec: JobSpec, manifest_generation: int, price: Price, store) -> dict[str, str]:
    """What the quote depends on, each hashed apart so a refusal can say which one changed."""
    files = job_inputs(spec, store)  # files, or the upstream's table (input.from_job)
    return {
        "input files": digest([(f.uri, f.size) for f in files]),
        "job spec": digest(spec.model_dump(mode="json", exclude={"budget_usd", "deadline", "description"})),
        "prompt version": spec.prompt.version,
        "model": spec.model,
        "prices": digest(price.model_dump(mode="json")),
        "manifest generation": str(manifest_generation),
    }


def max_output_tokens(spec: JobSpec) -> int:
    """The output tokens one request may bill: ``max_tokens``, and none for an embedding (billed as input only)."""
    return spec.max_output_tokens


def schema_tokens(spec: JobSpec) -> int:
    """The output schema travels with every request and is billed as input."""
    if spec.output.kind in ("text", "embedding"):
        return 0
    schema = choice_schema(spec.output.choice or []) if spec.output.kind == "choice" else spec.output.json_schema
    return math.ceil(len(json.dumps(schema)) / BYTES_PER_TOKEN)


def calibration(items: pl.DataFrame, results: pl.DataFrame, per_request_extra: int = 0) -> tuple[float, int]:
    """Measured / estimated input tokens (estimate incl. the per-request schema) over items with a billed
    answer; 1.0 until something is measured (``estimate.measured_ratio``)."""
    return measured_ratio(items, results, lambda estimated, n: estimated + per_request_extra * n)


def cache_prefix_tokens(spec: JobSpec, price: Price, tokens: RequestTokens | None = None) -> int:
    """Tokens of the prefix every request shares and the provider caches: the system prompt; where cache writes
    are billed (Anthropic) the tools before it too (the output schema), as the breakpoint on the system block
    caches both; the few-shot examples after it are part of the prefix (Anthropic's breakpoint follows the last
    one). 0 without a system prompt or examples (nothing is marked cacheable). ``tokens``: counted by the model's
    tokenizer (else bytes / 4)."""
    prefix = spec.prompt.prefix_text
    if not prefix:
        return 0
    if tokens is not None:
        return tokens.system_tokens + (tokens.schema_tokens if price.writes_cache else 0)
    system = math.ceil(len(prefix.encode()) / BYTES_PER_TOKEN)
    return system + (schema_tokens(spec) if price.writes_cache else 0)


def probe_estimates(spec: JobSpec, probes: pl.DataFrame) -> pl.DataFrame:
    """Probes (with user_prompt) and their estimated input tokens, counted like the manifest counts an item's
    (``est_input_tokens``: the rendered prompt, the system prompt and the examples; the schema is added per
    request)."""
    system_bytes = len(spec.prompt.prefix_text.encode())
    return probes.with_columns(
        estimate_request_tokens(pl.col("user_prompt").str.len_bytes(), system_bytes)
        .cast(pl.Int64)
        .alias("est_input_tokens")
    )


_PROBE_SCHEMA = {"shard_id": pl.String, "request_id": pl.String, "est_input_tokens": pl.Int64, "user_prompt": pl.String}


def riding_probes(
    spec: JobSpec,
    store,
    manifest: Manifest,
    shard_sizes: dict[str, int],
    answered: pl.DataFrame | None = None,
    with_prompt: bool = False,
) -> pl.DataFrame:
    """The golden probes that go out with the next submission of each listed shard (shard -> its item count),
    with their estimated tokens: shard_id, request_id, est_input_tokens (and user_prompt, ``with_prompt``).
    ``answered``: result rows with request_id (read from the store when not given)."""
    probes = GoldenProbes(spec, store)
    columns = ["shard_id", "request_id", "est_input_tokens", *(["user_prompt"] if with_prompt else [])]
    if not probes.enabled or not shard_sizes:
        return pl.DataFrame(schema=_PROBE_SCHEMA).select(columns)
    if answered is None:
        answered = read_results(store, spec.name, columns=["request_id"])
    shards = manifest.shard_ids()
    riding = probes.riding(shard_sizes, shards[0] if shards else None, answered)
    return probe_estimates(spec, riding).select(columns)


def plain_quote(spec: JobSpec, store, prices: PriceTable, basis: QuoteBasis = NOTHING_DONE) -> Quote:
    """The quote of a job on its own backend and model: the pending items' first pass, the golden probes riding
    along with them and the expected retries."""
    price = prices.lookup(spec.backend.name, spec.model)
    manifest = Manifest(spec.name, store)
    results = basis.results if basis.results is not None else pl.DataFrame()
    work = pending_work(manifest, basis.items, basis.states)
    per_request_extra = schema_tokens(spec)
    measured_items = work.measured_items(results)
    bytes_factor, calibrated_on = calibration(measured_items, results, per_request_extra)  # the budget guard's
    n = work.requests
    counter = counter_for(spec.model, spec.backend.settings)
    model = request_tokens(spec, sample_shards(manifest, *work.sample_source()), counter)
    factor, _ = token_calibration(measured_items, results, model)
    input_tokens = model.tokens(work.est_sum, n) * factor
    pricing = PassPricing.of(spec, price, cache_prefix_tokens(spec, price, model), factor, results, bool(calibrated_on))
    pending_by_shard = work.pending_by_shard
    write_batches = _first_write_batches(spec, store, manifest, pricing, pending_by_shard)
    cache = pricing.scenarios(n, input_tokens, write_batches)
    first = pricing.one_pass(n, input_tokens, cache)
    # with a golden set, ``results`` are the items' (JobState keeps probe rows apart): every row, for the probes
    # already answered and for what was spent on them
    stored = read_results(store, spec.name, columns=["request_id", "cost_usd"]) if spec.quality else None
    sizes = {sid: work.shard_sizes[sid] for sid in pending_by_shard}  # what decides the probes riding along
    probes = riding_probes(spec, store, manifest, sizes, stored, True)
    probe_costs = probe_pass(pricing, probes, counter, model)
    retries = retry_pass(spec, results, first)
    total = {
        "low": first["cost_low"] + probe_costs["cost_low"],
        "expected": first["cost_expected"] + probe_costs["cost_expected"] + retries["cost_expected"],
        "high": first["cost_high"] + probe_costs["cost_high"] + retries["cost_high"],
    }
    spent = _spent_usd(results, stored)
    components = quote_components(spec, manifest.last_generation(), price, store)
    now = datetime.now(UTC)
    return Quote(
        job=spec.name,
        model=spec.model,
        backend=spec.backend.name,
        pending_requests=n,
        probe_requests=probes.height,
        price=price,
        calibration=Calibration(factor=bytes_factor, items_measured=calibrated_on, tokenizer_factor=factor),
        tokenizer=model,
        cache_hit_share=Levels(**{level: read for level, (read, _) in cache.items()}),
        cache_write_share=Levels(**{level: write for level, (_, write) in cache.items()}),
        cache=CacheTerms(
            prefix_tokens=pricing.prefix,
            writes_billed=price.writes_cache,
            ttl=price.cache_ttl,
            write_multiplier=price.cache_write_multiplier,
            first_write_batches=write_batches,
        ),
        passes=QuotePasses(first=PassCost(**first), probes=ProbePass(**probe_costs), retries=RetryPass(**retries)),
        # multi-pass jobs: every pass of the cascade (core/money/passes.py); None for a one-pass job
        cascade=cascade_quote(
            spec,
            store,
            prices,
            (work.items, work.items_est),
            {"requests": n, "cost_expected": total["expected"], "cost_high": total["high"]},
        ),
        est_cost_usd=Levels(**{k: usd_figure(v) for k, v in total.items()}),
        spent_usd=usd_figure(spent),
        budget_usd=spec.budget_usd,
        within_budget=spec.budget_usd is None or spent + total["high"] <= spec.budget_usd,
        components=components,
        fingerprint=digest(components),
        created_at=now.isoformat(),
        expires_at=(now + QUOTE_TTL).isoformat(),
    )


def pending_work(manifest: Manifest, items: pl.DataFrame | None, states: pl.DataFrame | None) -> PendingWork:
    """The work to price: the job's own items from the manifest's per-shard totals when none are given, else the
    items given (each with its shard, joined from the manifest's index where they have none), item by item."""
    if items is None:
        return PendingWork.from_totals(manifest, states)
    if "shard_id" not in items.columns:
        index = pl.from_arrow(manifest.item_index(["request_id", "shard_id"]))
        assert isinstance(index, pl.DataFrame)
        items = items.join(index, on="request_id", how="left")
    return PendingWork.from_items(manifest, items, states)


def _first_write_batches(
    spec: JobSpec, store, manifest: Manifest, pricing: PassPricing, pending_by_shard: dict[str, int]
) -> int:
    """The batches whose first request writes the cached prefix (where writes are billed): one per shard with
    pending items, and the canary sample's own."""
    canary_shard = manifest.canary_shard_id() if pending_by_shard else None
    write_batches = len(pending_by_shard) if pricing.price.writes_cache and pricing.prefix else 0
    if (
        write_batches
        and canary_passed(spec, store) is None
        and pending_by_shard.get(canary_shard, 0) > spec.canary.size
    ):
        write_batches += 1  # the canary sample goes in a batch of its own
    return write_batches


def _spent_usd(results: pl.DataFrame, stored: pl.DataFrame | None) -> float:
    """What the job has spent: its results' cost, or all stored rows' where that is more (probes are paid too)."""
    spent = float(results["cost_usd"].sum() or 0.0) if results.height and "cost_usd" in results.columns else 0.0
    if stored is not None:
        spent = max(spent, float(stored["cost_usd"].sum() or 0.0))
    return spent


def quote_price(spec: JobSpec, prices: PriceTable) -> Price:
    """The price a quote's fingerprint binds: the job's, or a routed job's first candidate's."""
    if spec.backend.name == AUTO_BACKEND:
        assert spec.route is not None
        first = spec.route.candidates[0]
        return prices.lookup(first.backend.name, first.model or spec.model)
    return prices.lookup(spec.backend.name, spec.model)


def quote_current(quote: Quote | None, now: datetime | None = None) -> bool:
    """The one freshness rule: a quote is spent on until ``QUOTE_MARGIN`` before it expires. The driver re-quotes
    from then on, and a submission refuses it, so the two never disagree about the same quote."""
    now = now or datetime.now(UTC)
    return quote is not None and datetime.fromisoformat(quote.expires_at) > now + QUOTE_MARGIN


def verify_quote(spec: JobSpec, store, prices: PriceTable, quote: Quote | None, now: datetime | None = None) -> Quote:
    """Refuse spend on a missing, expired, changed or over-budget quote; say exactly why."""
    if quote is None:
        raise QuoteRefused(f"job {spec.name} has no quote; materialize {spec.name}/quote first")
    now = now or datetime.now(UTC)
    if not quote_current(quote, now):
        raise QuoteRefused(
            f"job {spec.name}: the quote expired at {quote.expires_at} (or is in its last "
            f"{QUOTE_MARGIN.seconds // 60} min, when nothing is spent on it); quote again "
            f"(materialize {spec.name}/quote) before spending"
        )
    price = quote_price(spec, prices)
    current = quote_components(spec, Manifest(spec.name, store).last_generation(), price, store)
    changed = [k for k, v in current.items() if quote.components.get(k) != v]
    if changed:
        raise QuoteRefused(
            f"job {spec.name}: the quote no longer matches its inputs; changed since it was made: "
            f"{', '.join(changed)}; quote again before spending"
        )
    high = quote.est_cost_usd.high
    if spec.budget_usd is not None and quote.spent_usd + high > spec.budget_usd:
        raise QuoteRefused(
            f"job {spec.name}: spent {format_usd(quote.spent_usd)} + the quote's high estimate "
            f"{format_usd(high)} exceeds budget_usd ${spec.budget_usd}; "
            "nothing was submitted"
        )
    return quote
