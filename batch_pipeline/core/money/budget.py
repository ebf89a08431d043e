"""The hard budget during a run: before every paid call, committed spend plus what is in flight plus the
cost of the next submission (at its high estimate) must fit in ``budget_usd``; otherwise the job stops,
resumable, at the cap. Raising the budget and resuming continues without repeating anything. It reads the items
of the shards it prices (the next one, those in flight) and, to calibrate, those of the shards with results: never
every item of the job.

A submission is its pending items and the golden probes that ride along with it (all of the golden set with
the canary, ``quality.golden_share`` of a shard otherwise; see ``core/quality/golden.py``): probes are paid requests, so
they count here and in flight like items. The high estimate of a request, where the provider bills cache writes
(Anthropic), has its whole cacheable prefix written at the write multiplier (a cache miss on every request).
"""

import logging

import polars as pl
import pyarrow as pa

from batch_pipeline.core.errors import SystemicError
from batch_pipeline.core.ledger.attempts import Attempt, AttemptLog
from batch_pipeline.core.ledger.control import JobControl
from batch_pipeline.core.ledger.result_parts import read_results
from batch_pipeline.core.manifest.shards import Manifest
from batch_pipeline.core.money.pass_cost import UNCALIBRATED_MARGIN
from batch_pipeline.core.money.pending import est_total, measured_items
from batch_pipeline.core.money.quote import (
    cache_prefix_tokens,
    calibration,
    max_output_tokens,
    probe_estimates,
    riding_probes,
    schema_tokens,
)
from batch_pipeline.core.pricing.cost import Price
from batch_pipeline.core.quality.golden import GoldenProbes
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.store import Store

log = logging.getLogger(__name__)


class BudgetGuard:
    def __init__(
        self, spec: JobSpec, store: Store, price: Price | None, quoted_factor: float = 1.0, batch: bool = True
    ):
        self.spec, self.store, self.price, self.batch = spec, store, price, batch
        self.quoted_factor = self.factor = quoted_factor
        self.schema_tokens = schema_tokens(spec)
        self.prefix_tokens = cache_prefix_tokens(spec, price) if price is not None and price.writes_cache else 0
        self.manifest = Manifest(spec.name, store)
        self.probes = GoldenProbes(spec, store)
        self._sent: dict[tuple[str, int, str, int], tuple[float, int]] = {}  # see _sent_items
        self._logs: dict[str, tuple[list[tuple[str, int, int | None]], list[Attempt]]] = {}  # see _attempts

    def _calibrate(self, results: pl.DataFrame | None = None) -> None:
        """Measured usage beats the quote's factor; before anything is measured, keep a safety margin.
        ``results``: the job's results with ``input_tokens``, when the caller has read them already."""
        if results is None:
            results = read_results(self.store, self.spec.name, columns=["shard_id", "input_tokens"])
        if results.height:  # the items of the shards with results (all of them where results carry no shard)
            factor, measured = calibration(measured_items(self.manifest, results), results, self.schema_tokens)
            if measured:
                self.factor = factor
                return
        self.factor = max(self.quoted_factor, 1.0) * UNCALIBRATED_MARGIN

    def request_cost_high(self, est_input_tokens: float, requests: int) -> float:
        """``requests`` requests of ``est_input_tokens`` estimated input in all, at their highest: every output
        token allowed, and every cacheable prefix written (where writes are billed)."""
        assert self.price is not None
        tokens = (est_input_tokens + requests * self.schema_tokens) * self.factor
        writes = min(tokens, requests * self.prefix_tokens * self.factor)
        return self.price.cost(
            tokens, requests * max_output_tokens(self.spec), batch=self.batch, cache_write_tokens=writes
        )

    def riding_probes(self, shard_id: str) -> pl.DataFrame:
        """The golden probes the shard's next submission carries (request_id, est_input_tokens); none once any
        probe of the shard has a result."""
        if not self.probes.enabled:
            return pl.DataFrame(schema={"shard_id": pl.String, "request_id": pl.String, "est_input_tokens": pl.Int64})
        size = self.manifest.shard_items(shard_id, ["request_id"]).num_rows
        answered = read_results(self.store, self.spec.name, shard_id, ["request_id"])
        return riding_probes(self.spec, self.store, self.manifest, {shard_id: size}, answered)

    def _in_flight(self) -> float:
        """Submitted but not yet collected attempts (their items and probes), at their high estimate."""
        total = 0.0
        for shard in self.manifest.shard_ids():
            for attempt in self._attempts(shard):
                if not attempt.open and attempt.abandoned is not None:  # a kill: sent, maybe billed, no answer
                    total += attempt.abandoned.possibly_billed_usd or 0.0
                    continue
                if attempt.open and attempt.submitted:
                    total += self.request_cost_high(*self._sent_items(shard, attempt))
                    recorded = self.probes.recorded(shard) if self.probes.enabled else None
                    if recorded is not None:
                        probes = probe_estimates(
                            self.spec, recorded.filter(pl.col("request_id").is_in(attempt.request_ids))
                        )
                        if probes.height:
                            total += self.request_cost_high(float(probes["est_input_tokens"].sum()), probes.height)
        return total

    def _attempts(self, shard: str) -> list[Attempt]:
        """The shard's attempts, parsed again only when a record file of it appeared or changed (size, mtime): an
        intent holds every request ID it sent (~3 MB of JSON for 50,000), and every check reads every shard's."""
        log = AttemptLog(self.store, self.spec.name, shard)
        stats = self.store.file_stats(log.paths.attempts(shard))
        cached = self._logs.get(shard)
        if cached is None or cached[0] != stats:
            cached = self._logs[shard] = (stats, log.all())
        return cached[1]

    def _sent_items(self, shard: str, attempt: Attempt) -> tuple[float, int]:
        """(estimated input tokens, items) of what an attempt sent, once per guard: its intent is written once
        (exclusively) and a shard's items never change, while every check prices every open attempt again (with a
        job's shards in flight, each submission re-read all their shard files: quadratic in shards)."""
        key = (shard, attempt.number, attempt.key, len(attempt.request_ids))
        if key not in self._sent:
            items = pl.from_arrow(self.manifest.shard_items(shard, ["request_id", "est_input_tokens"]))
            assert isinstance(items, pl.DataFrame)
            sent = items.filter(pl.col("request_id").is_in(pl.Series(attempt.request_ids, dtype=pl.String)))
            self._sent[key] = (float(est_total(sent)), sent.height)
        return self._sent[key]

    def check(self, shard_id: str, pending: pa.Table) -> None:
        """Raise (and stop the job) if sending ``pending`` and the probes riding along with it could take spend
        past the budget."""
        budget = self.spec.budget_usd
        if budget is None or self.price is None:
            return
        probes = self.riding_probes(shard_id)
        if pending.num_rows == 0 and probes.height == 0:
            return
        results = read_results(self.store, self.spec.name, columns=["shard_id", "input_tokens", "cost_usd"])
        self._calibrate(results)
        items = pl.from_arrow(self.manifest.shard_items(shard_id, ["request_id", "est_input_tokens"]))
        assert isinstance(items, pl.DataFrame)
        nxt = items.filter(pl.col("request_id").is_in(pl.Series(pending.column("request_id"), dtype=pl.String)))
        next_items = self.request_cost_high(float(est_total(nxt)), nxt.height)
        next_probes = (
            self.request_cost_high(float(probes["est_input_tokens"].sum()), probes.height) if probes.height else 0.0
        )
        next_cost = next_items + next_probes
        spent = float(results["cost_usd"].sum() or 0.0)
        in_flight = self._in_flight()
        if spent + in_flight + next_cost > budget:
            what = f"{nxt.height} items ${next_items:.6f}" + (
                f" + {probes.height} golden probes ${next_probes:.6f}" if probes.height else ""
            )
            reason = (
                f"budget cap: spent ${spent:.6f} + in flight ${in_flight:.6f} + next submission of shard "
                f"{shard_id} ${next_cost:.6f} ({what}) would exceed budget_usd ${budget}"
            )
            JobControl(self.store, self.spec.name).stop(reason, code="budget")
            raise SystemicError(reason + "; raise budget_usd and resume to continue", code="budget")
        log.info(
            "budget: spent %.6f, in flight %.6f, next %.6f (%d probes %.6f) of %.6f",
            spent,
            in_flight,
            next_cost,
            probes.height,
            next_probes,
            budget,
        )
