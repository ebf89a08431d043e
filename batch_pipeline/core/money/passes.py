"""Every pass of a multi-pass job in one quote: the passes before this job, this job, the passes after it.

A pass after this one (a job whose ``input.from_job`` reads this job's table, and so on down) has no manifest
yet, so it is priced from this job's items: its requests are this job's items times the share that passes its
filter, each with this job's row content (the user part of this job's token estimate) inside that pass's own
system prompt, template and output schema, answered with up to its ``max_tokens``, at its model's price. The share
is ``input.assumed_share`` (default 30%) until the upstream answers something, then measured on its answers so far
(the canary first), then on its validated table once it has published (``UpstreamTable.share``). Passes before this
one are shown as their own quote and report left them: spent, and what their quote still expects.
"""

import math
import string
from dataclasses import asdict, dataclass

import polars as pl

from batch_pipeline.core.errors import ConfigError
from batch_pipeline.core.manifest.upstream import PassShare, ShareSource, UpstreamTable, chain, downstream_specs
from batch_pipeline.core.money.estimate import schema_text
from batch_pipeline.core.money.quote_record import Cascade, CascadePass, CascadeTotal, read_quote
from batch_pipeline.core.pricing.cost import BYTES_PER_TOKEN, PriceTable, fixed_request_tokens
from batch_pipeline.core.pricing.usd import format_usd, usd_figure
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store

UNMEASURED_MARGIN = 1.25  # the high end of a pass priced from another job's rows


@dataclass(frozen=True)
class PassQuote:
    number: int  # 1: the job that reads files
    job: str
    model: str
    backend: str
    share: float  # of its upstream's rows (1.0 for the first pass)
    share_source: str  # ShareSource, or "all" for the first pass
    measured_on: int
    requests: int
    cost_expected: float
    cost_high: float
    spent_usd: float = 0.0
    priced_from: str = "own quote"  # or "this job's items" (a pass not built yet), "its quote and report"

    def as_record(self) -> CascadePass:
        out = asdict(self)
        out["cost_expected"], out["cost_high"] = usd_figure(self.cost_expected), usd_figure(self.cost_high)
        return CascadePass(**out)


def cascade_quote(
    spec: JobSpec, store: Store, prices: PriceTable, items: pl.DataFrame | tuple[int, int], own: dict[str, float]
) -> Cascade | None:
    """The passes of ``spec``'s cascade, priced (None for a one-pass job). ``items``: this job's items
    (est_input_tokens), or their count and the sum of their est_input_tokens; ``own``: this job's remaining
    ``requests``, ``cost_expected`` and ``cost_high``."""
    before = chain(spec)[:-1]
    after = _after(spec)
    if not before and not after:
        return None
    passes = [_quoted(i + 1, up, store) for i, up in enumerate(before)]
    passes.append(
        _pass_of(
            len(before) + 1,
            spec,
            _upstream_share(spec, store),
            int(own["requests"]),
            own["cost_expected"],
            own["cost_high"],
        )
    )
    n_items, est_sum = _item_totals(items)
    user_tokens = _user_tokens(spec, n_items, est_sum)
    rows = {spec.name: float(n_items)}
    left_out: dict[str, str] = {}  # a later pass whose spec is broken does not break this job's quote
    for depth, down in after:
        if down.input.from_job not in rows:
            continue  # below a pass left out
        up_rows = rows[down.input.from_job]
        try:
            s = _share(down, store)
        except ConfigError as exc:
            left_out[down.name] = str(exc)
            continue
        requests = up_rows * s.share
        rows[down.name] = requests
        expected, high = price_pass(down, prices, requests, user_tokens)
        passes.append(
            _pass_of(len(before) + 1 + depth, down, s, math.ceil(requests), expected, high, f"{spec.name}'s items")
        )
    return Cascade(
        passes=[p.as_record() for p in passes],
        total=CascadeTotal(
            expected=usd_figure(sum(p.cost_expected for p in passes)),
            high=usd_figure(sum(p.cost_high for p in passes)),
            spent_usd=usd_figure(sum(p.spent_usd for p in passes)),
        ),
        left_out=left_out,
    )


def _after(spec: JobSpec) -> list[tuple[int, JobSpec]]:
    """The passes after ``spec``, each with its distance from it, parents before children."""
    out, todo, seen = [], [(1, d) for d in downstream_specs(spec)], {spec.name}
    while todo:
        depth, job = todo.pop(0)
        if job.name in seen:
            continue
        seen.add(job.name)
        out.append((depth, job))
        todo += [(depth + 1, d) for d in downstream_specs(job)]
    return out


def _share(spec: JobSpec, store: Store) -> PassShare:
    try:
        return UpstreamTable(spec, store).share()
    except FileNotFoundError:
        return PassShare(spec.input.assumed_share, ShareSource.ASSUMED, 0)


def _upstream_share(spec: JobSpec, store: Store) -> PassShare | None:
    """The share of its upstream's rows that reach ``spec``; None for the first pass (it reads files)."""
    return _share(spec, store) if spec.input.from_job is not None else None


def _pass_of(
    number: int,
    spec: JobSpec,
    share: PassShare | None,
    requests: int,
    cost_expected: float,
    cost_high: float,
    priced_from: str = "own quote",
    spent_usd: float = 0.0,
) -> PassQuote:
    """``spec``'s pass, named by its job, model and backend; ``share`` None: the first pass, every row."""
    return PassQuote(
        number,
        spec.name,
        spec.model,
        spec.backend.name,
        share.share if share else 1.0,
        share.source.value if share else "all",
        share.measured_on if share else 0,
        requests,
        cost_expected,
        cost_high,
        spent_usd=spent_usd,
        priced_from=priced_from,
    )


def _item_totals(items: pl.DataFrame | tuple[int, int]) -> tuple[int, int | None]:
    """(items, the sum of their est_input_tokens; None without the column)."""
    if isinstance(items, tuple):
        return items
    if "est_input_tokens" not in items.columns:
        return items.height, None
    return items.height, int(items["est_input_tokens"].cast(pl.Int64).sum() or 0)


def _user_tokens(spec: JobSpec, n_items: int, est_sum: int | None) -> float:
    """The mean row content of this job's items in tokens (the estimate less its system and framing part)."""
    if n_items == 0 or est_sum is None:
        return 0.0
    fixed = fixed_request_tokens(len(spec.prompt.prefix_text.encode()))  # as the manifest counted it
    return max(float(est_sum) / n_items - fixed, 0.0)  # the mean, as Polars takes it: the sum over the count


def price_pass(spec: JobSpec, prices: PriceTable, requests: float, user_tokens: float) -> tuple[float, float]:
    """(expected, high) cost of ``requests`` requests of ``spec`` whose rows carry ``user_tokens`` each."""
    price = prices.lookup(spec.backend.name, spec.model)
    literal = sum(len(part) for part, *_ in _template_parts(spec.prompt.template))
    schema = schema_text(spec)
    per_request = (
        user_tokens
        + fixed_request_tokens(len(spec.prompt.prefix_text.encode()))
        + (literal + len(schema or "")) / BYTES_PER_TOKEN
    )
    batch = spec.backend.name.endswith("_batch")
    tokens_in = requests * per_request
    tokens_out = requests * spec.max_output_tokens
    expected = price.cost(tokens_in, tokens_out, batch=batch)
    return expected, price.cost(tokens_in * UNMEASURED_MARGIN, tokens_out, batch=batch)


def _template_parts(template: str) -> list[tuple[str, str | None, str | None, str | None]]:
    return list(string.Formatter().parse(template))


def _quoted(number: int, spec: JobSpec, store: Store) -> PassQuote:
    """A pass before this one, as its own quote and report left it."""
    paths = JobPaths(spec.name)
    quote = read_quote(store, spec.name)
    report = store.read_json(paths.report) or {}
    done = bool(report.get("complete"))
    return _pass_of(
        number,
        spec,
        _upstream_share(spec, store),
        int(report.get("unique_requests") or (quote.pending_requests if quote else 0)),
        0.0 if done or quote is None else quote.est_cost_usd.expected,
        0.0 if done or quote is None else quote.est_cost_usd.high,
        "its quote and report",
        spent_usd=float(report.get("cost_usd") or (quote.spent_usd if quote else 0.0)),
    )


def describe(cascade: Cascade) -> str:
    """One line for the passes, for logs and the CLI."""
    parts = [
        f"pass {p.number} {p.job}: {p.requests} requests at share {p.share:.2f} "
        f"({p.share_source}), {format_usd(p.cost_expected)} expected"
        for p in cascade.passes
    ]
    return "; ".join([*parts, f"total {format_usd(cascade.total.expected)} expected"])
