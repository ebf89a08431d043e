"""Per-shard outlier detection: same-distribution shards pass, a skewed or long-winded shard is flagged."""

import random

import polars as pl

from batch_pipeline.core.quality.shard_stats import shard_outliers

LABELS = ["billing", "bug", "feature_request", "account", "other"]
WEIGHTS = [0.26, 0.3, 0.14, 0.19, 0.11]


def results(
    shards: int, per_shard: int, seed: int, skew: dict[str, str] | None = None, long_shard: str | None = None
) -> pl.DataFrame:
    rng = random.Random(seed)
    rows = []
    for s in range(1, shards + 1):
        sid = f"s{s:05d}"
        for i in range(per_shard):
            label = (skew or {}).get(sid) or rng.choices(LABELS, WEIGHTS)[0]
            rows.append(
                {
                    "request_id": f"{sid}-{i}",
                    "attempt": 1,
                    "shard_id": sid,
                    "status": "succeeded",
                    "parsed_output": label,
                    "output_tokens": 40 if sid == long_shard else rng.randint(8, 12),
                    "error_message": None,
                }
            )
    return pl.DataFrame(rows)


def test_shards_from_one_distribution_are_not_flagged():
    for seed in range(5):
        for per_shard in (10, 50, 500):
            stats = shard_outliers(results(20, per_shard, seed), "choice")
            assert stats.filter(pl.col("flagged").is_not_null()).height == 0, (seed, per_shard)


def test_skewed_labels_and_long_outputs_are_flagged():
    stats = shard_outliers(results(12, 40, 1, skew={"s00004": "feature_request"}, long_shard="s00009"), "choice")
    flagged = dict(stats.filter(pl.col("flagged").is_not_null()).select("shard_id", "flagged").iter_rows())
    assert flagged == {"s00004": "label distribution", "s00009": "output length"}
