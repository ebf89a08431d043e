"""One pass of requests priced at three cache levels: the quote's first pass, its golden probes and its retries.

Kept apart from the quote (``quote.plain_quote``) that gathers what they are priced from: the price, the cached
prefix, the measured cache shares and outputs, and the token calibration.
"""

from dataclasses import dataclass

import polars as pl

from batch_pipeline.core.money.estimate import RequestTokens
from batch_pipeline.core.pricing.cost import Price
from batch_pipeline.core.pricing.tokenizers import TokenCounter
from batch_pipeline.core.spec.job import JobSpec

DEFAULT_RETRY_SHARE = 0.02  # expected share of items retried before anything is measured
UNCALIBRATED_MARGIN = 1.25  # token estimates are bytes/4 until usage is measured

CacheShares = dict[str, tuple[float, float]]  # level (low, expected, high) -> (cache-read, cache-write) share


def cache_scenarios(
    prefix_share: float, first_write_share: float, writes_billed: bool, measured: tuple[float, float] | None
) -> CacheShares:
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


@dataclass(frozen=True)
class PassPricing:
    """What prices a pass of requests at the three cache levels: one rule for the first pass and the probes."""

    price: Price
    batch: bool  # the batch price applies
    prefix: int  # the cached prefix's tokens (``quote.cache_prefix_tokens``)
    factor: float  # measured / the tokenizer's count
    measured: tuple[float, float] | None  # (read, write) cache shares of the results so far
    mean_out: float  # output tokens a request is expected to bill
    out_cap: int  # the most output tokens a request may bill
    margin: float  # on the high end's input tokens

    @classmethod
    def of(
        cls, spec: JobSpec, price: Price, prefix: int, factor: float, results: pl.DataFrame, calibrated: bool
    ) -> "PassPricing":
        """``results``: the job's results so far (they measure the cache shares and the mean output)."""
        return cls(
            price=price,
            batch=spec.backend.name.endswith("_batch"),
            prefix=prefix,
            factor=factor,
            measured=measured_cache_shares(results),
            mean_out=mean_output_tokens(results, spec.max_output_tokens),
            out_cap=spec.max_output_tokens,
            margin=1.0 if calibrated else UNCALIBRATED_MARGIN,  # the high end must hold before anything is measured
        )

    def scenarios(self, requests: int, tokens: float, first_writes: int) -> CacheShares:
        """The cache shares of ``requests`` requests of ``tokens`` in all, ``first_writes`` of them first of a
        batch (each writes the prefix)."""
        prefix, factor = self.prefix, self.factor
        share = min(1.0, prefix * requests * factor / max(tokens, 1.0)) if prefix and requests else 0.0
        first = min(share, prefix * first_writes * factor / max(tokens, 1.0)) if prefix else 0.0
        return cache_scenarios(share, first, self.price.writes_cache, self.measured)

    def priced(self, tokens: float, out_tokens: float, shares: tuple[float, float]) -> float:
        read, write = shares
        return self.price.cost(
            tokens, out_tokens, cached_tokens=tokens * read, batch=self.batch, cache_write_tokens=tokens * write
        )

    def one_pass(self, requests: int, tokens: float, cache: CacheShares) -> dict:
        """A ``PassCost``'s fields: the low end at the most cache hits, the high end at the fewest, full outputs."""
        mean_out, out_cap = self.mean_out, self.out_cap
        return {
            "requests": requests,
            "input_tokens": round(tokens),
            "output_tokens_expected": round(requests * mean_out),
            "output_tokens_max": requests * out_cap,
            "cost_low": self.priced(tokens, requests * mean_out, cache["high"]),
            "cost_expected": self.priced(tokens, requests * mean_out, cache["expected"]),
            "cost_high": self.priced(tokens * self.margin, requests * out_cap, cache["low"]),
        }


def mean_output_tokens(results: pl.DataFrame, out_cap: int) -> float:
    """The measured mean output of the succeeded results; ``out_cap`` until one has succeeded."""
    ok = results.filter(pl.col("status") == "succeeded") if results.height else results
    return float(ok["output_tokens"].mean() or 0.0) if ok.height else float(out_cap)


def measured_cache_shares(results: pl.DataFrame) -> tuple[float, float] | None:
    """(read, write) shares of the billed input that the results so far read from and wrote to the cache."""
    if not results.height or "cached_tokens" not in results.columns:
        return None
    billed_input = max(float(results["input_tokens"].sum()), 1.0)
    writes = float(results["cache_write_tokens"].sum()) if "cache_write_tokens" in results.columns else 0.0
    return float(results["cached_tokens"].sum()) / billed_input, writes / billed_input


def probe_pass(pricing: PassPricing, probes: pl.DataFrame, counter: TokenCounter, tokens: RequestTokens) -> dict:
    """A ``ProbePass``'s fields: the probes riding along (few, their prompts at hand: counted one by one)."""
    n_probes = probes.height
    probe_tokens = (
        sum(counter.count(probes["user_prompt"].to_list())) + n_probes * tokens.fixed_tokens
    ) * pricing.factor
    return {
        **pricing.one_pass(n_probes, probe_tokens, pricing.scenarios(n_probes, probe_tokens, 0)),
        "shards": probes["shard_id"].n_unique(),
    }  # they ride in the items' batches: no write of their own


def retry_pass(spec: JobSpec, results: pl.DataFrame, first: dict) -> dict:
    """A ``RetryPass``'s fields: the first pass's cost times the share expected to be retried, and at most the
    retry-spend cap. Probes are not retried."""
    retry_share = _measured_retry_share(results) if results.height else DEFAULT_RETRY_SHARE
    return {
        "expected_share": retry_share,
        "cost_expected": first["cost_expected"] * retry_share,
        "cost_high": first["cost_high"] * spec.retries.spend_cap_share,
    }


def _measured_retry_share(results: pl.DataFrame) -> float:
    per_item = results.group_by("request_id").agg((pl.col("status") != "succeeded").any().alias("failed"))
    return float(per_item["failed"].mean() or 0.0)
