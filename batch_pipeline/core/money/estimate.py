"""The quote's input tokens per request, by the model family's tokenizer, from the manifest's cheap estimate.

The manifest stores ``est_input_tokens`` (user bytes / 4 plus a fixed system-and-framing part) for every item;
tokenizing every prompt of a 10M-item job at each quote would take minutes. So the user part is rescaled by
tokenizer tokens per estimated token, measured on a sample of pending prompts (up to ``SAMPLE_ITEMS`` from up to
``SAMPLE_SHARDS`` shards spread over the pending ones, the lowest request IDs of each: a hash order, so an
unbiased draw), and the fixed part is counted exactly: the system message and the few-shot examples, the output
schema (billed as input) and the framing (4 tokens per message, each example its own, 3 to prime the reply). An
embeddings request is its input text alone: no messages, so no framing (and no system prompt or schema).
"""

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import polars as pl

from batch_pipeline.core.manifest.shards import Manifest
from batch_pipeline.core.pricing.cost import (
    MESSAGE_OVERHEAD_TOKENS,
    REQUEST_OVERHEAD_TOKENS,
    fixed_request_tokens,
)
from batch_pipeline.core.pricing.tokenizers import TokenCounter, counter_for
from batch_pipeline.core.spec.contract_floor import choice_schema
from batch_pipeline.core.spec.job import JobSpec

SAMPLE_ITEMS = 2048
SAMPLE_SHARDS = 8
SAMPLE_COLUMNS = ["request_id", "user_prompt", "est_input_tokens"]
ROW = "_row"  # a row's position in its shard file


@dataclass(frozen=True)
class RequestTokens:
    """Tokens of a request from its ``est_input_tokens``: (estimate - fixed_estimated) x per_estimated +
    fixed_tokens."""

    tokenizer: str
    exact: bool
    per_estimated: float  # tokenizer tokens of the user prompt per estimated token, on the sample
    fixed_estimated: int  # the fixed part inside est_input_tokens
    fixed_tokens: int  # system + schema + framing, by the tokenizer
    system_tokens: int
    schema_tokens: int
    sampled: int

    def tokens(self, est_sum: float, requests: int) -> float:
        """Input tokens of ``requests`` requests whose estimates sum to ``est_sum``."""
        return max(est_sum - requests * self.fixed_estimated, 0.0) * self.per_estimated + requests * self.fixed_tokens

    def as_dict(self) -> dict:
        return asdict(self)


def schema_text(spec: JobSpec) -> str | None:
    """The output schema as it travels with every request (None for free text and embeddings)."""
    if spec.output.kind in ("text", "embedding"):
        return None
    return json.dumps(
        choice_schema(spec.output.choice or []) if spec.output.kind == "choice" else spec.output.json_schema
    )


def prompt_sample(
    manifest: Manifest, pending: pl.DataFrame, limit: int = SAMPLE_ITEMS, shards: int = SAMPLE_SHARDS
) -> pl.DataFrame:
    """request_id, user_prompt and est_input_tokens of up to ``limit`` pending items (``pending``: request_id,
    shard_id)."""
    ids = sorted(pending["shard_id"].unique().to_list()) if pending.height else []
    return sample_shards(manifest, ids, pending.select("request_id"), "semi", limit, shards)


def sample_shards(
    manifest: Manifest,
    shard_ids: list[str],
    ids: pl.DataFrame | None,
    how: str = "semi",
    limit: int = SAMPLE_ITEMS,
    shards: int = SAMPLE_SHARDS,
) -> pl.DataFrame:
    """``prompt_sample`` from up to ``shards`` of ``shard_ids`` (sorted, each with items to sample), spread over
    them: the rows of each shard's file that ``ids`` (request_id) keeps (``how="semi"``) or leaves (``"anti"``;
    every row when ``ids`` is None), the lowest request IDs first."""
    if not shard_ids:
        return pl.DataFrame(schema={"request_id": pl.String, "user_prompt": pl.String, "est_input_tokens": pl.Int64})
    step = max(1, len(shard_ids) / shards)
    chosen = [shard_ids[int(i * step)] for i in range(min(shards, len(shard_ids)))]
    per_shard = math.ceil(limit / len(chosen))
    parts = [_lowest_of_shard(manifest, shard, ids, how, per_shard) for shard in chosen]
    return pl.concat(parts).select("request_id", "user_prompt", pl.col("est_input_tokens").cast(pl.Int64))


def _lowest_of_shard(manifest: Manifest, shard: str, ids: pl.DataFrame | None, how: str, n: int) -> pl.DataFrame:
    """The ``n`` lowest request IDs of one shard that ``ids`` keeps or leaves, with their prompts. The IDs are
    read first, and the prompts only up to the last row chosen: a shard file is written in request-ID order
    (``Dealer._write_shard``), so that is its first rows (~7 against ~50 ms for 50,000 prompts). A file in
    another order is read further, up to all of it: the same rows either way."""
    keys = pl.from_arrow(manifest.shard_items(shard, ["request_id"]))
    assert isinstance(keys, pl.DataFrame)
    keys = keys.with_row_index(ROW)
    if ids is not None:
        keys = keys.join(ids, on="request_id", how=how)  # type: ignore[arg-type]
    picked = keys.bottom_k(n, by="request_id").get_column(ROW)
    rows = int(picked.max()) + 1 if picked.len() else 0  # type: ignore[arg-type]
    head, _ = manifest.store.read_head(manifest.paths.shard_items(shard), rows, SAMPLE_COLUMNS)
    frame = pl.from_arrow(head)
    assert isinstance(frame, pl.DataFrame)
    return frame.with_row_index(ROW).filter(pl.col(ROW).is_in(picked)).sort("request_id").drop(ROW)


def request_tokens(spec: JobSpec, sample: pl.DataFrame, counter: TokenCounter | None = None) -> RequestTokens:
    """The token model of ``spec``'s requests, its user part measured on ``sample`` (user_prompt,
    est_input_tokens)."""
    counter = counter or counter_for(spec.model, spec.backend.settings)
    system = spec.prompt.prefix_text  # the system prompt and the few-shot examples: the same in every request
    schema = schema_text(spec)
    system_tokens = counter.count([system])[0] if system else 0
    schema_tokens = counter.count([schema])[0] if schema else 0
    messages = (1 if spec.prompt.system else 0) + len(spec.prompt.examples) + 1  # system, examples, the row's
    fixed_tokens = system_tokens + messages * MESSAGE_OVERHEAD_TOKENS + REQUEST_OVERHEAD_TOKENS + schema_tokens
    if spec.output.embedding is not None:  # the text alone is billed: no chat framing (no system, no schema)
        fixed_tokens = 0
    fixed_estimated = fixed_request_tokens(len(system.encode()))
    per_estimated = 1.0
    if sample.height:
        estimated = float(sample["est_input_tokens"].sum()) - sample.height * fixed_estimated
        if estimated > 0:
            per_estimated = sum(counter.count(sample["user_prompt"].to_list())) / estimated
    return RequestTokens(
        counter.name,
        counter.exact,
        per_estimated,
        fixed_estimated,
        fixed_tokens,
        system_tokens,
        schema_tokens,
        sample.height,
    )


def measured_ratio(
    items: pl.DataFrame, results: pl.DataFrame, estimate: Callable[[float, int], float]
) -> tuple[float, int]:
    """Measured / estimated input tokens over the items with a billed answer, and how many: (1.0, 0) until then.
    ``estimate(bytes-or-tokens estimated, requests)`` turns the items' ``est_input_tokens`` into the estimate to
    compare with (the one place the ratio, and its guard against an estimate of 0, is computed)."""
    if results.height == 0 or "input_tokens" not in results.columns:
        return 1.0, 0
    measured = results.filter(pl.col("input_tokens") > 0).group_by("request_id").agg(pl.col("input_tokens").first())
    joined = measured.join(items.select("request_id", "est_input_tokens"), on="request_id")
    if joined.height == 0:
        return 1.0, 0
    estimated = estimate(float(joined["est_input_tokens"].cast(pl.Int64).sum()), joined.height)
    return float(joined["input_tokens"].sum()) / max(estimated, 1.0), joined.height


def token_calibration(items: pl.DataFrame, results: pl.DataFrame, model: RequestTokens) -> tuple[float, int]:
    """Measured / tokenizer-estimated input tokens (``measured_ratio``)."""
    return measured_ratio(items, results, model.tokens)
