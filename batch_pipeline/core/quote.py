"""The quote: the job's remaining work priced before any spend, as a range, bound to its inputs.

Priced from the real request plan: every pending item's rendered prompt with the system prompt and
the output schema counted per request (as the provider bills them), output tokens from ``max_tokens``
(or, once results exist, their measured mean), a cache-hit range (low / expected / high) and each
pass apart (first pass, expected retries). Token estimates are calibrated against measured usage as
soon as any results exist. A quote is bound to a SHA-256 fingerprint of its inputs and expires; a
changed or expired quote is refused at submission with a message that says what changed.
"""

import hashlib
import json
import math
from datetime import UTC, datetime, timedelta

import polars as pl

from batch_pipeline.core.cost import BYTES_PER_TOKEN, Price, PriceTable
from batch_pipeline.core.errors import ConfigError
from batch_pipeline.core.inputs import resolve_inputs
from batch_pipeline.core.manifest import Manifest
from batch_pipeline.core.reconcile import DEAD, VALID
from batch_pipeline.core.spec import JobSpec
from batch_pipeline.core.validate import choice_schema

QUOTE_TTL = timedelta(minutes=30)
DEFAULT_RETRY_SHARE = 0.02  # expected share of items retried before anything is measured
UNCALIBRATED_MARGIN = 1.25  # token estimates are bytes/4 until usage is measured


class QuoteRefused(ConfigError):
    """No spend without a current quote: missing, expired, changed, or over budget."""


def _sha(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def quote_components(spec: JobSpec, manifest_generation: int, price: Price) -> dict[str, str]:
    """What the quote depends on, each hashed apart so a refusal can say which one changed."""
    files = resolve_inputs(spec.input.path, spec.input.format, spec.input_base_dir())
    return {
        "input files": _sha([(f.uri, f.size) for f in files]),
        "job spec": _sha(spec.model_dump(mode="json", exclude={"budget_usd", "deadline", "description"})),
        "prompt version": spec.prompt.version,
        "model": spec.model,
        "prices": _sha(price.model_dump(mode="json")),
        "manifest generation": str(manifest_generation),
    }


def schema_tokens(spec: JobSpec) -> int:
    """The output schema travels with every request and is billed as input."""
    if spec.output.kind == "text":
        return 0
    schema = choice_schema(spec.output.choice or []) if spec.output.kind == "choice" else spec.output.json_schema
    return math.ceil(len(json.dumps(schema)) / BYTES_PER_TOKEN)


def calibration(items: pl.DataFrame, results: pl.DataFrame, per_request_extra: int = 0) -> tuple[float, int]:
    """Measured / estimated input tokens (estimate incl. the per-request schema) over items with a billed
    answer; 1.0 until something is measured."""
    if results.height == 0 or "input_tokens" not in results.columns:
        return 1.0, 0
    measured = results.filter(pl.col("input_tokens") > 0).group_by("request_id").agg(pl.col("input_tokens").first())
    joined = measured.join(items.select("request_id", "est_input_tokens"), on="request_id")
    if joined.height == 0:
        return 1.0, 0
    estimated = float(joined["est_input_tokens"].sum()) + per_request_extra * joined.height
    return float(joined["input_tokens"].sum()) / estimated, joined.height


def make_quote(spec: JobSpec, store, prices: PriceTable, items: pl.DataFrame | None = None,
               results: pl.DataFrame | None = None, states: pl.DataFrame | None = None) -> dict:
    price = prices.lookup(spec.backend.name, spec.model)
    manifest = Manifest(spec.name, store)
    if items is None:
        frame = pl.from_arrow(manifest.item_index(["request_id", "est_input_tokens"]))
        assert isinstance(frame, pl.DataFrame)
        items = frame
    results = results if results is not None else pl.DataFrame()
    pending = items
    if states is not None and states.height:
        done = states.filter(pl.col("state").is_in([VALID, DEAD])).select("request_id")
        pending = items.join(done, on="request_id", how="anti")
    per_request_extra = schema_tokens(spec)
    factor, calibrated_on = calibration(items, results, per_request_extra)
    n = pending.height
    input_tokens = (float(pending["est_input_tokens"].sum() or 0) + n * per_request_extra) * factor
    ok = results.filter(pl.col("status") == "succeeded") if results.height else results
    mean_out = float(ok["output_tokens"].mean()) if ok.height else float(spec.sampling.max_tokens)
    system_share = 0.0
    if spec.prompt.system and n:
        system_tokens = math.ceil(len(spec.prompt.system.encode()) / BYTES_PER_TOKEN)
        system_share = min(1.0, system_tokens * n * factor / max(input_tokens, 1.0))
    measured_cache = (float(results["cached_tokens"].sum()) / max(float(results["input_tokens"].sum()), 1.0)
                      if results.height and "cached_tokens" in results.columns else None)
    cache = {"low": 0.0, "expected": measured_cache if measured_cache is not None else system_share / 2,
             "high": max(system_share, measured_cache or 0.0)}
    batch = spec.backend.name.endswith("_batch")

    margin = 1.0 if calibrated_on else UNCALIBRATED_MARGIN  # the high end must hold before anything is measured

    def cost(out_tokens: float, cache_share: float, scale: float = 1.0) -> float:
        tokens = input_tokens * scale
        return price.cost(tokens, n * out_tokens, cached_tokens=tokens * cache_share, batch=batch)

    first = {"requests": n, "input_tokens": round(input_tokens), "output_tokens_expected": round(n * mean_out),
             "output_tokens_max": n * spec.sampling.max_tokens,
             "cost_low": cost(mean_out, cache["high"]), "cost_expected": cost(mean_out, cache["expected"]),
             "cost_high": cost(spec.sampling.max_tokens, cache["low"], margin)}
    retry_share = _measured_retry_share(results) if results.height else DEFAULT_RETRY_SHARE
    retries = {"expected_share": retry_share, "cost_expected": first["cost_expected"] * retry_share,
               "cost_high": first["cost_high"] * spec.retries.spend_cap_share}
    total = {"low": first["cost_low"], "expected": first["cost_expected"] + retries["cost_expected"],
             "high": first["cost_high"] + retries["cost_high"]}
    spent = float(results["cost_usd"].sum() or 0.0) if results.height and "cost_usd" in results.columns else 0.0
    components = quote_components(spec, manifest.last_generation(), price)
    now = datetime.now(UTC)
    return {
        "job": spec.name, "model": spec.model, "backend": spec.backend.name,
        "pending_requests": n, "price": price.model_dump(mode="json"),
        "calibration": {"factor": factor, "items_measured": calibrated_on},
        "cache_hit_share": cache, "passes": {"first": first, "retries": retries},
        "est_cost_usd": {k: round(v, 6) for k, v in total.items()},
        "spent_usd": round(spent, 6), "budget_usd": spec.budget_usd,
        "within_budget": spec.budget_usd is None or spent + total["high"] <= spec.budget_usd,
        "components": components, "fingerprint": _sha(components),
        "created_at": now.isoformat(), "expires_at": (now + QUOTE_TTL).isoformat(),
    }


def _measured_retry_share(results: pl.DataFrame) -> float:
    per_item = results.group_by("request_id").agg((pl.col("status") != "succeeded").any().alias("failed"))
    return float(per_item["failed"].mean() or 0.0)


def verify_quote(spec: JobSpec, store, prices: PriceTable, quote: dict | None, now: datetime | None = None) -> dict:
    """Refuse spend on a missing, expired, changed or over-budget quote; say exactly why."""
    if quote is None:
        raise QuoteRefused(f"job {spec.name} has no quote; materialize {spec.name}/quote first")
    now = now or datetime.now(UTC)
    if datetime.fromisoformat(quote["expires_at"]) < now:
        raise QuoteRefused(f"job {spec.name}: the quote expired at {quote['expires_at']}; quote again "
                           f"(materialize {spec.name}/quote) before spending")
    price = prices.lookup(spec.backend.name, spec.model)
    current = quote_components(spec, Manifest(spec.name, store).last_generation(), price)
    changed = [k for k, v in current.items() if quote.get("components", {}).get(k) != v]
    if changed:
        raise QuoteRefused(f"job {spec.name}: the quote no longer matches its inputs; changed since it was made: "
                           f"{', '.join(changed)}; quote again before spending")
    spent = quote.get("spent_usd", 0.0)
    if spec.budget_usd is not None and spent + quote["est_cost_usd"]["high"] > spec.budget_usd:
        raise QuoteRefused(f"job {spec.name}: spent ${spent:.4f} + the quote's high estimate "
                           f"${quote['est_cost_usd']['high']:.4f} exceeds budget_usd ${spec.budget_usd}; "
                           "nothing was submitted")
    return quote
