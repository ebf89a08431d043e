"""`batch-pipeline quote <job> [--compare]`: price a job before any spend (nothing is sent).

``--compare`` answers "what would this job cost elsewhere?": the whole job (every request, done or not) on each
backend, and, when some of it is done and some remains, the remaining work too; each table says which it is.
"""

import argparse

from rich.console import Console
from rich.table import Table

from batch_pipeline.cli_jobs import resolve_job, store_for
from batch_pipeline.cli_stops import ExitCode
from batch_pipeline.core.pricing.usd import format_budget, format_usd

COLUMNS = [
    "backend",
    "model",
    "requests",
    "cost_expected_usd",
    "cost_high_usd",
    "cost_per_million_items_usd",
    "tokenizer",
    "checked",
    "gpu_hours",
    "break_even_utilisation",
]


def _compare_table(title: str, rows: list[dict]) -> Table:
    table = Table(title=title)
    for c in COLUMNS:  # backend and model names are never cut: the other columns wrap instead
        width = max((len(str(r.get(c) or "")) for r in rows), default=0) if c in ("backend", "model") else None
        table.add_column(
            c.removesuffix("_usd").replace("_", " "),
            justify="right",
            min_width=width,  # "$" in cells
            no_wrap=width is not None,
        )
    for r in rows:
        table.add_row(*[_cell(c, r.get(c)) for c in COLUMNS])
    return table


def _cell(column: str, value) -> str:
    """Dollar columns as dollars with their significant digits ($0.0000052, not 5.2e-06)."""
    if value is None:
        return ""
    if column.endswith("_usd") and isinstance(value, int | float) and not isinstance(value, bool):
        return format_usd(float(value))
    return str(value)


def cmd_quote(args: argparse.Namespace, console: Console) -> int:
    """Quote a job (building its manifest if needed; nothing is sent), optionally on every configured backend."""
    from batch_pipeline.core.manifest.shards import Manifest, build_manifest
    from batch_pipeline.core.money.compare import compare_backends
    from batch_pipeline.core.pricing.cost import load_prices
    from batch_pipeline.core.publish.quoting import comparison_inputs, quote_job
    from batch_pipeline.core.spec.job import CostCompareSpec
    from batch_pipeline.executors.registry import route_profile, route_queues

    spec = resolve_job(args.job, args.settings)
    store = store_for(args.settings)
    if Manifest(spec.name, store).last_generation() == 0:
        summary = build_manifest(spec, store)
        console.print(f"manifest built: {summary.new_requests} requests in {len(summary.new_shards)} shards")
    prices = load_prices(args.settings.prices)
    q, routes = quote_job(spec, store, prices, route_profile, route_queues(store))  # routes: backend: auto
    if not args.compare:
        est = q.est_cost_usd
        console.print(
            f"job {spec.name}: {q.pending_requests} requests on {spec.backend.name}/{spec.model}: "
            f"{format_usd(est.low)} low, {format_usd(est.expected)} expected, "
            f"{format_usd(est.high)} high (budget {format_budget(spec.budget_usd)}; within: "
            f"{q.within_budget})",
            markup=False,
            highlight=False,
        )
        return ExitCode.DONE
    compare = spec.cost_compare or CostCompareSpec()
    inputs = comparison_inputs(spec, store)
    whole = compare_backends(spec, store, prices, compare, inputs, every_priced=True, whole_job=True)
    remaining = compare_backends(spec, store, prices, compare, inputs, every_priced=True)
    total, left = whole[0]["requests"], remaining[0]["requests"]
    if left == total:
        note = "nothing done yet: all of it remains"
    elif left == 0:
        note = "all of it is done: nothing remains"
    else:
        note = f"{total - left} done, {left} remain (priced below)"
    console.print(_compare_table(f"job {spec.name}: the whole job ({total} requests) on each backend ({note})", whole))
    if 0 < left < total:
        console.print(
            _compare_table(
                f"job {spec.name}: the remaining work ({left} of {total} requests) on each backend", remaining
            )
        )
    if routes:  # backend: auto: each shard's choice, why, and what each candidate would cost for it
        labels = sorted({k for c in routes.values() for k in c.costs})
        route_table = Table(title=f"job {spec.name}: the route (backend: auto)")
        for c in ["shard", "chosen", "rule", "reason", *[f"{k} ($)" for k in labels]]:
            route_table.add_column(c)
        for c in routes.values():
            route_table.add_row(
                c.shard_id,
                f"{c.backend}/{c.model}",
                c.rule,
                c.reason,
                *["-" if c.costs.get(k) is None else format_usd(c.costs[k]) for k in labels],
            )
        console.print(route_table)
    return ExitCode.DONE


def add_quote_command(sub, console: Console) -> None:
    p = sub.add_parser("quote", help="price a job before any spend (no request is sent)")
    p.add_argument("job", help="job name or spec path")
    p.add_argument(
        "--compare",
        action="store_true",
        help="the whole job, and the remaining work if any, on every backend (cost_compare, then every "
        "priced model), and self-hosted",
    )
    p.add_argument("--home")
    p.set_defaults(fn=lambda args: cmd_quote(args, console))
