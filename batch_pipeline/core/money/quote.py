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
from batch_pipeline.core.ledger.reconcile import DEAD, VALID
from batch_pipeline.core.ledger.result_parts import read_results
from batch_pipeline.core.manifest.shards import Manifest
from batch_pipeline.core.manifest.upstream import job_inputs
from batch_pipeline.core.money.estimate import (
    RequestTokens,
    measured_ratio,
    prompt_sample,
    request_tokens,
    token_calibration,
)
from batch_pipeline.core.money.passes import cascade_quote
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
DEFAULT_RETRY_SHARE = 0.02  # expected share of items retried before anything is measured
UNCALIBRATED_MARGIN = 1.25  # token estimates are bytes/4 until usage is measured


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
        return pl.DataFrame(
            schema={
                "shard_id": pl.String,
                "request_id": pl.String,
                "est_input_tokens": pl.Int64,
                "user_prompt": pl.String,
            }
        ).select(columns)
    if answered is None:
        answered = read_results(store, spec.name, columns=["request_id"])
    shards = manifest.shard_ids()
    riding = probes.riding(shard_sizes, shards[0] if shards else None, answered)
    return probe_estimates(spec, riding).select(columns)


def cache_scenarios(
    prefix_share: float, first_write_share: float, writes_billed: bool, measured: tuple[float, float] | None
) -> dict[str, tuple[float, float]]:
    """(cache-read share, cache-write share) of the input tokens when cache hits are low, expected and high.

    ``prefix_share``: the cacheable prefix's share of the input; ``first_write_share``: the share written by the
    first request of each batch; ``measured``: (read, write) shares of the results so far, if any.
    """
    read_m, write_m = measured if measured is not None else (None, None)
    high_read = max(prefix_share, read_m or 0.0)
    if not writes_billed:  # automatic caching: a miss is billed as plain input
        return {
            "low": (0.0, 0.0),
            "expected": (read_m if read_m is not None else prefix_share / 2, 0.0),
            "high": (high_read, 0.0),
        }
    first = min(first_write_share, high_read)
    expected = (
        (read_m, write_m or 0.0)
        if read_m is not None
        else (min(prefix_share / 2, prefix_share - first), max(prefix_share / 2, first))
    )
    return {
        "low": (0.0, max(prefix_share, (read_m or 0.0) + (write_m or 0.0))),
        "expected": expected,
        "high": (high_read - first, first),
    }


def plain_quote(
    spec: JobSpec,
    store,
    prices: PriceTable,
    items: pl.DataFrame | None = None,
    results: pl.DataFrame | None = None,
    states: pl.DataFrame | None = None,
) -> Quote:
    price = prices.lookup(spec.backend.name, spec.model)
    manifest = Manifest(spec.name, store)
    if items is None:
        frame = pl.from_arrow(manifest.item_index(["request_id", "shard_id", "est_input_tokens"]))
        assert isinstance(frame, pl.DataFrame)
        items = frame
    elif "shard_id" not in items.columns:
        index = pl.from_arrow(manifest.item_index(["request_id", "shard_id"]))
        assert isinstance(index, pl.DataFrame)
        items = items.join(index, on="request_id", how="left")
    results = results if results is not None else pl.DataFrame()
    pending = items
    if states is not None and states.height:
        done = states.filter(pl.col("state").is_in([VALID, DEAD])).select("request_id")
        pending = items.join(done, on="request_id", how="anti")
    per_request_extra = schema_tokens(spec)
    bytes_factor, calibrated_on = calibration(items, results, per_request_extra)  # what the budget guard scales
    n = pending.height
    counter = counter_for(spec.model, spec.backend.settings)
    model = request_tokens(spec, prompt_sample(manifest, pending if n else items), counter)
    factor, _ = token_calibration(items, results, model)
    input_tokens = model.tokens(float(pending["est_input_tokens"].sum() or 0), n) * factor
    ok = results.filter(pl.col("status") == "succeeded") if results.height else results
    out_cap = max_output_tokens(spec)
    mean_out = float(ok["output_tokens"].mean() or 0.0) if ok.height else float(out_cap)
    batch = spec.backend.name.endswith("_batch")
    margin = 1.0 if calibrated_on else UNCALIBRATED_MARGIN  # the high end must hold before anything is measured

    # the cache: the prefix's share of the input, the first write of each batch, what was measured
    prefix = cache_prefix_tokens(spec, price, model)
    pending_by_shard = dict(pending.group_by("shard_id").len().iter_rows()) if n else {}
    canary_shard = manifest.canary_shard_id() if pending_by_shard else None
    write_batches = len(pending_by_shard) if price.writes_cache and prefix else 0
    if (
        write_batches
        and canary_passed(spec, store) is None
        and pending_by_shard.get(canary_shard, 0) > spec.canary.size
    ):
        write_batches += 1  # the canary sample goes in a batch of its own
    measured = None
    if results.height and "cached_tokens" in results.columns:
        billed_input = max(float(results["input_tokens"].sum()), 1.0)
        writes = float(results["cache_write_tokens"].sum()) if "cache_write_tokens" in results.columns else 0.0
        measured = (float(results["cached_tokens"].sum()) / billed_input, writes / billed_input)

    def scenarios(requests: int, tokens: float, first_writes: int) -> dict[str, tuple[float, float]]:
        share = min(1.0, prefix * requests * factor / max(tokens, 1.0)) if prefix and requests else 0.0
        first = min(share, prefix * first_writes * factor / max(tokens, 1.0)) if prefix else 0.0
        return cache_scenarios(share, first, price.writes_cache, measured)

    def priced(tokens: float, out_tokens: float, shares: tuple[float, float]) -> float:
        read, write = shares
        return price.cost(
            tokens, out_tokens, cached_tokens=tokens * read, batch=batch, cache_write_tokens=tokens * write
        )

    def one_pass(requests: int, tokens: float, cache: dict[str, tuple[float, float]]) -> dict:
        return {
            "requests": requests,
            "input_tokens": round(tokens),
            "output_tokens_expected": round(requests * mean_out),
            "output_tokens_max": requests * out_cap,
            "cost_low": priced(tokens, requests * mean_out, cache["high"]),
            "cost_expected": priced(tokens, requests * mean_out, cache["expected"]),
            "cost_high": priced(tokens * margin, requests * out_cap, cache["low"]),
        }

    cache = scenarios(n, input_tokens, write_batches)
    first = one_pass(n, input_tokens, cache)
    shard_sizes = (
        dict(items.filter(pl.col("shard_id").is_in(list(pending_by_shard))).group_by("shard_id").len().iter_rows())
        if pending_by_shard
        else {}
    )
    # with a golden set, ``results`` are the items' (JobState keeps probe rows apart): every row, for the probes
    # already answered and for what was spent on them
    stored = read_results(store, spec.name, columns=["request_id", "cost_usd"]) if spec.quality else None
    probes = riding_probes(spec, store, manifest, shard_sizes, stored, with_prompt=True)
    n_probes = probes.height  # few, and their prompts are at hand: counted one by one
    probe_tokens = (sum(counter.count(probes["user_prompt"].to_list())) + n_probes * model.fixed_tokens) * factor
    probe_pass = {
        **one_pass(n_probes, probe_tokens, scenarios(n_probes, probe_tokens, 0)),
        "shards": probes["shard_id"].n_unique(),
    }  # they ride in the items' batches: no write of their own
    retry_share = _measured_retry_share(results) if results.height else DEFAULT_RETRY_SHARE
    retries = {
        "expected_share": retry_share,
        "cost_expected": first["cost_expected"] * retry_share,
        "cost_high": first["cost_high"] * spec.retries.spend_cap_share,
    }  # probes are not retried
    total = {
        "low": first["cost_low"] + probe_pass["cost_low"],
        "expected": first["cost_expected"] + probe_pass["cost_expected"] + retries["cost_expected"],
        "high": first["cost_high"] + probe_pass["cost_high"] + retries["cost_high"],
    }
    spent = float(results["cost_usd"].sum() or 0.0) if results.height and "cost_usd" in results.columns else 0.0
    if stored is not None:  # probes are paid too
        spent = max(spent, float(stored["cost_usd"].sum() or 0.0))
    components = quote_components(spec, manifest.last_generation(), price, store)
    now = datetime.now(UTC)
    return Quote(
        job=spec.name,
        model=spec.model,
        backend=spec.backend.name,
        pending_requests=n,
        probe_requests=n_probes,
        price=price,
        calibration=Calibration(factor=bytes_factor, items_measured=calibrated_on, tokenizer_factor=factor),
        tokenizer=model,
        cache_hit_share=Levels(**{level: read for level, (read, _) in cache.items()}),
        cache_write_share=Levels(**{level: write for level, (_, write) in cache.items()}),
        cache=CacheTerms(
            prefix_tokens=prefix,
            writes_billed=price.writes_cache,
            ttl=price.cache_ttl,
            write_multiplier=price.cache_write_multiplier,
            first_write_batches=write_batches,
        ),
        passes=QuotePasses(first=PassCost(**first), probes=ProbePass(**probe_pass), retries=RetryPass(**retries)),
        # multi-pass jobs: every pass of the cascade (core/money/passes.py); None for a one-pass job
        cascade=cascade_quote(
            spec, store, prices, items, {"requests": n, "cost_expected": total["expected"], "cost_high": total["high"]}
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


def _measured_retry_share(results: pl.DataFrame) -> float:
    per_item = results.group_by("request_id").agg((pl.col("status") != "succeeded").any().alias("failed"))
    return float(per_item["failed"].mean() or 0.0)


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
