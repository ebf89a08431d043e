"""Per-shard statistics against the neighbours: a shard whose label distribution, output lengths or
refusal rate stands out from the other shards is flagged (a drifting model, a bad batch, a poisoned input
file show up here before anyone reads the table).
"""

from dataclasses import dataclass

import polars as pl

# a shard is an outlier when its labels differ from the pooled other shards both significantly (chi-square,
# p < 0.001) and materially (total variation distance); small shards are judged by the test, big ones by both
MAX_LABEL_TVD = 0.20
Z_P001 = 3.090
MAX_LENGTH_RATIO = 2.0  # median output tokens vs the median over shards, either way
MAX_REFUSAL_EXCESS = 0.10  # refusal rate above the median over shards
MIN_ITEMS = 5  # shards smaller than this are too noisy to judge


@dataclass
class ShardAggregates:
    """What the outlier test needs of some shards' results, summed per shard: ``per_shard`` (shard_id, items,
    median_output_tokens, refusal_rate) and ``label_counts`` (shard_id, label, len) of the succeeded items.
    A request ID belongs to one shard, so a group of shards is aggregated alone and the groups are stacked."""

    per_shard: pl.DataFrame
    label_counts: pl.DataFrame

    @classmethod
    def of(cls, results: pl.DataFrame) -> "ShardAggregates":
        """``results``: one row per result with request_id, attempt, shard_id, status, parsed_output,
        output_tokens, error_message (the latest attempt of each item counts)."""
        latest = results.sort("attempt").unique(["request_id"], keep="last")
        per_shard = latest.group_by("shard_id").agg(
            pl.len().alias("items"),
            pl.col("output_tokens").filter(pl.col("status") == "succeeded").median().alias("median_output_tokens"),
            pl.col("error_message").fill_null("").str.starts_with("refused").mean().alias("refusal_rate"),
        )
        valid = latest.filter(pl.col("status") == "succeeded").select(
            "shard_id", pl.col("parsed_output").alias("label")
        )
        return cls(per_shard, valid.group_by("shard_id", "label").len())

    @classmethod
    def stacked(cls, parts: list["ShardAggregates"]) -> "ShardAggregates":
        empty = cls.of(pl.DataFrame(schema=_RESULT_COLUMNS))
        parts = [empty, *parts]
        return cls(
            pl.concat([p.per_shard for p in parts], how="vertical_relaxed"),
            pl.concat([p.label_counts for p in parts], how="vertical_relaxed"),
        )


_RESULT_COLUMNS = {
    "request_id": pl.String,
    "attempt": pl.Int32,
    "shard_id": pl.String,
    "status": pl.String,
    "parsed_output": pl.String,
    "output_tokens": pl.Int64,
    "error_message": pl.String,
}
STATS_COLUMNS = list(_RESULT_COLUMNS)  # what the test reads of the results


def shard_outliers(results: pl.DataFrame, contract: str) -> pl.DataFrame:
    """``outliers`` of the shards of ``results`` (every result row in one frame)."""
    return outliers(ShardAggregates.of(results), contract)


def outliers(agg: ShardAggregates, contract: str) -> pl.DataFrame:
    """One row per shard: label TVD vs the others, median output tokens, refusal rate, and why it is flagged."""
    per_shard = agg.per_shard
    tvd = (
        _label_tests(agg.label_counts)
        if contract == "choice"
        else pl.DataFrame(
            {
                "shard_id": per_shard["shard_id"],
                "label_tvd": [0.0] * per_shard.height,
                "label_chi2": [0.0] * per_shard.height,
                "chi2_critical": [1.0] * per_shard.height,
            }
        )
    )
    stats = per_shard.join(tvd, on="shard_id", how="left").with_columns(
        pl.col("label_tvd").fill_null(0.0), pl.col("label_chi2").fill_null(0.0), pl.col("chi2_critical").fill_null(1.0)
    )
    median_len = stats["median_output_tokens"].median() or 0.0
    median_refusal = stats["refusal_rate"].median() or 0.0
    judged = pl.col("items") >= MIN_ITEMS
    reasons = [
        pl.when(judged & (pl.col("label_tvd") > MAX_LABEL_TVD) & (pl.col("label_chi2") > pl.col("chi2_critical"))).then(
            pl.lit("label distribution")
        ),
        pl.when(
            judged
            & (
                (pl.col("median_output_tokens") > median_len * MAX_LENGTH_RATIO)
                | (pl.col("median_output_tokens") < median_len / MAX_LENGTH_RATIO)
            )
        ).then(pl.lit("output length")),
        pl.when(judged & (pl.col("refusal_rate") > median_refusal + MAX_REFUSAL_EXCESS)).then(pl.lit("refusals")),
    ]
    return (
        stats.with_columns(pl.concat_str(reasons, separator=", ", ignore_nulls=True).alias("flagged"))
        .with_columns(pl.col("flagged").replace("", None))
        .sort("shard_id")
    )


def chi2_critical(df: int, z: float = Z_P001) -> float:
    """Upper quantile of chi-square (Wilson-Hilferty), p = 0.001 by default."""
    df = max(df, 1)
    return df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3


def _label_tests(counts: pl.DataFrame) -> pl.DataFrame:
    """Per shard: TVD and chi-square of its label counts (shard_id, label, len) against a robust reference, the
    median share of each label across shards (renormalised), so one skewed shard does not drag the reference
    towards itself."""
    labels = counts.select("label").unique()
    shard_sizes = counts.group_by("shard_id").agg(pl.col("len").sum().alias("n"))
    grid = (
        shard_sizes.join(labels, how="cross")
        .join(counts, on=["shard_id", "label"], how="left")
        .with_columns(pl.col("len").fill_null(0))
        .with_columns((pl.col("len") / pl.col("n")).alias("p_shard"))
    )
    smoothing = 0.5 / max(float(counts["len"].sum()), 1.0)  # a label no shard's median gives must not divide by zero
    reference = grid.group_by("label").agg((pl.col("p_shard").median() + smoothing).alias("p_ref"))
    reference = reference.with_columns(pl.col("p_ref") / pl.col("p_ref").sum())
    grid = grid.join(reference, on="label").with_columns((pl.col("n") * pl.col("p_ref")).alias("expected"))
    out = grid.group_by("shard_id").agg(
        ((pl.col("p_shard") - pl.col("p_ref")).abs().sum() / 2).fill_nan(0.0).alias("label_tvd"),
        ((pl.col("len") - pl.col("expected")) ** 2 / pl.col("expected")).sum().alias("label_chi2"),
    )
    return out.with_columns(pl.lit(chi2_critical(labels.height - 1)).alias("chi2_critical"))
