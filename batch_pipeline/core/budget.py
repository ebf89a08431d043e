"""The hard budget during a run: before every paid call, committed spend plus what is in flight plus the
cost of the next submission (at its high estimate) must fit in ``budget_usd``; otherwise the job stops,
resumable, at the cap. Raising the budget and resuming continues without repeating anything.
"""

import logging

import polars as pl
import pyarrow as pa

from batch_pipeline.core.attempts import AttemptLog
from batch_pipeline.core.control import JobControl
from batch_pipeline.core.cost import Price
from batch_pipeline.core.errors import SystemicError
from batch_pipeline.core.manifest import Manifest
from batch_pipeline.core.quote import UNCALIBRATED_MARGIN, calibration, schema_tokens
from batch_pipeline.core.results import read_results
from batch_pipeline.core.spec import JobSpec
from batch_pipeline.core.store import Store

log = logging.getLogger(__name__)


class BudgetGuard:
    def __init__(self, spec: JobSpec, store: Store, price: Price | None, quoted_factor: float = 1.0,
                 batch: bool = True):
        self.spec, self.store, self.price, self.batch = spec, store, price, batch
        self.quoted_factor = self.factor = quoted_factor
        self.schema_tokens = schema_tokens(spec)
        self.manifest = Manifest(spec.name, store)

    def _calibrate(self, results: pl.DataFrame | None = None) -> None:
        """Measured usage beats the quote's factor; before anything is measured, keep a safety margin.
        ``results``: the job's results with ``input_tokens``, when the caller has read them already."""
        if results is None:
            results = read_results(self.store, self.spec.name, columns=["input_tokens"])
        if results.height:
            items = pl.from_arrow(self.manifest.item_index(["request_id", "est_input_tokens"]))
            assert isinstance(items, pl.DataFrame)
            factor, measured = calibration(items, results, self.schema_tokens)
            if measured:
                self.factor = factor
                return
        self.factor = max(self.quoted_factor, 1.0) * UNCALIBRATED_MARGIN

    def request_cost_high(self, est_input_tokens: float, requests: int) -> float:
        assert self.price is not None
        return self.price.cost((est_input_tokens + requests * self.schema_tokens) * self.factor, requests * self.spec.sampling.max_tokens,
                               batch=self.batch)

    def _in_flight(self) -> float:
        """Submitted but not yet collected attempts, at their high estimate."""
        total = 0.0
        for shard in self.manifest.shard_ids():
            for attempt in AttemptLog(self.store, self.spec.name, shard).all():
                if attempt.open and attempt.submitted:
                    items = pl.from_arrow(self.manifest.shard_items(shard, ["request_id", "est_input_tokens"]))
                    assert isinstance(items, pl.DataFrame)
                    sent = items.filter(pl.col("request_id").is_in(attempt.request_ids))
                    total += self.request_cost_high(float(sent["est_input_tokens"].sum() or 0), sent.height)
        return total

    def check(self, shard_id: str, pending: pa.Table) -> None:
        """Raise (and stop the job) if sending ``pending`` could take spend past the budget."""
        budget = self.spec.budget_usd
        if budget is None or self.price is None or pending.num_rows == 0:
            return
        results = read_results(self.store, self.spec.name, columns=["input_tokens", "cost_usd"])
        self._calibrate(results)
        items = pl.from_arrow(self.manifest.shard_items(shard_id, ["request_id", "est_input_tokens"]))
        assert isinstance(items, pl.DataFrame)
        nxt = items.filter(pl.col("request_id").is_in(pending.column("request_id").to_pylist()))
        next_cost = self.request_cost_high(float(nxt["est_input_tokens"].sum() or 0), nxt.height)
        spent = float(results["cost_usd"].sum() or 0.0)
        in_flight = self._in_flight()
        if spent + in_flight + next_cost > budget:
            reason = (f"budget cap: spent ${spent:.6f} + in flight ${in_flight:.6f} + next submission of shard "
                      f"{shard_id} ${next_cost:.6f} would exceed budget_usd ${budget}")
            JobControl(self.store, self.spec.name).stop(reason, code="budget")
            raise SystemicError(reason + "; raise budget_usd and resume to continue", code="budget")
        log.info("budget: spent %.6f, in flight %.6f, next %.6f of %.6f", spent, in_flight, next_cost, budget)
