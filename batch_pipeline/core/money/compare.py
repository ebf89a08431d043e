"""Backend comparison: the same request plan quoted on every configured backend, and the self-hosted
break-even: what a GPU costs per million items at a given utilisation, and the utilisation at which it
matches the batch API.

Self-hosted cost = GPU hours x $/hour, where GPU hours = (uncached prefill tokens / prefill tokens/s +
output tokens / decode tokens/s) / 3600 / utilisation / (1 - spot loss). The break-even utilisation is the
utilisation at which that equals the batch API's expected cost (cost scales with 1 / utilisation).
"""

from batch_pipeline.core.money.job_quote import make_quote
from batch_pipeline.core.money.pending import NOTHING_DONE, QuoteBasis
from batch_pipeline.core.pricing.cost import PriceTable
from batch_pipeline.core.spec.job import BackendChoice, BackendSpec, CostCompareSpec, JobSpec, SelfHostedCost


def self_hosted(
    input_tokens: float, output_tokens: float, items: int, cfg: SelfHostedCost, api_cost: float | None
) -> dict:
    busy_s = (
        input_tokens * (1 - cfg.prefix_hit_share) / cfg.prefill_tokens_per_s + output_tokens / cfg.decode_tokens_per_s
    )
    cost_at_full = busy_s / 3600 / (1 - cfg.spot_loss) * cfg.gpu_usd_per_hour * cfg.gpus
    cost = cost_at_full / cfg.utilisation
    out = {
        "gpu_hours": round(busy_s / 3600 / cfg.utilisation / (1 - cfg.spot_loss) * cfg.gpus, 4),
        "cost_usd": round(cost, 6),
        "cost_per_million_items_usd": round(cost / items * 1e6, 2) if items else None,
        "utilisation": cfg.utilisation,
    }
    if api_cost:
        out["break_even_utilisation"] = round(cost_at_full / api_cost, 4)  # above this, self-hosting is cheaper
    return out


SELF_HOSTED_BACKENDS = ("vllm",)  # priced by the GPU hour (the self-hosted row), not per token


def priced_choices(prices: PriceTable, known: list[BackendChoice]) -> list[BackendChoice]:
    """Every (backend, model) of the price table that ``known`` does not list, in the table's order."""
    seen = {(c.backend.name, c.model) for c in known}
    return [
        BackendChoice(backend=BackendSpec(name=backend), model=model)
        for backend, models in prices.prices.items()
        if backend not in SELF_HOSTED_BACKENDS
        for model in models
        if (backend, model) not in seen
    ]


def compare_backends(
    spec: JobSpec,
    store,
    prices: PriceTable,
    compare: CostCompareSpec,
    basis: QuoteBasis = NOTHING_DONE,
    every_priced: bool = False,
    whole_job: bool = False,
) -> list[dict]:
    """One row per backend: expected and high cost, cost per million items, the tokenizer that counted the input
    and the price's ``checked`` date; then the self-hosted row. ``every_priced``: also every other model of every
    backend in the price table (the same plan and prompts on each). ``whole_job``: price every request of the
    job, done or not ("what would this job cost elsewhere?"); otherwise only the remaining work. Each row's
    ``scope`` says which."""
    rows = []
    scope = "whole job" if whole_job else "remaining"
    if whole_job:  # no states: every item counts as pending (results still calibrate)
        basis = QuoteBasis(basis.items, basis.results, None)
    # a routed job (backend: auto): its routed total first, then each route candidate with every shard on it
    routed = [BackendChoice(backend=c.backend, model=c.model) for c in spec.route.candidates] if spec.route else []
    choices = [BackendChoice(backend=spec.backend, model=spec.model), *routed, *compare.backends]
    if every_priced:
        choices += priced_choices(prices, [c.model_copy(update={"model": c.model or spec.model}) for c in choices])
    for choice in choices:
        variant = spec.model_copy(update={"backend": choice.backend, "model": choice.model or spec.model})
        q = make_quote(variant, store, prices, basis)
        n = q.pending_requests
        rows.append(
            {
                "scope": scope,
                "backend": choice.backend.name,
                "model": variant.model,
                "requests": n,
                "cost_expected_usd": q.est_cost_usd.expected,
                "cost_high_usd": q.est_cost_usd.high,
                "cost_per_million_items_usd": round(q.est_cost_usd.expected / n * 1e6, 2) if n else None,
                "input_tokens": q.passes.first.input_tokens,
                "output_tokens": q.passes.first.output_tokens_expected,
                "tokenizer": q.tokenizer.tokenizer,
                "checked": q.price.checked.isoformat(),  # as the stored quote shows it
            }
        )
    if compare.self_hosted is not None and rows:
        base = rows[0]
        api = next((r["cost_expected_usd"] for r in rows if r["backend"].endswith("_batch")), None)
        sh = self_hosted(base["input_tokens"], base["output_tokens"], base["requests"], compare.self_hosted, api)
        rows.append(
            {
                "scope": scope,
                "backend": "self_hosted",
                "model": spec.model,
                "requests": base["requests"],
                "cost_expected_usd": sh["cost_usd"],
                "cost_high_usd": None,
                "cost_per_million_items_usd": sh["cost_per_million_items_usd"],
                "input_tokens": base["input_tokens"],
                "output_tokens": base["output_tokens"],
                "gpu_hours": sh["gpu_hours"],
                "break_even_utilisation": sh.get("break_even_utilisation"),
            }
        )
    return rows
