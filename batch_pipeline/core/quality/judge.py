"""Judge sampling: a stratified sample of accepted outputs (by length bucket and shard) graded pass/fail by
a judge model through the same executors, with the pass rate's interval and the judge's agreement with the
golden labels (on golden probes, where the truth is known).
"""

import hashlib
import math

import polars as pl
import pyarrow as pa

from batch_pipeline.core.ledger.executor import RequestPlan, ShardWork, StreamExecutor
from batch_pipeline.core.quality.evals import Interval, wilson
from batch_pipeline.core.quality.validate import validate
from batch_pipeline.core.spec.job import JobSpec, OutputSpec, SamplingSpec

VERDICTS = ["pass", "fail"]
JUDGE_TEMPLATE = "Task:\n{task}\n\nAnswer:\n{answer}\n\nVerdict (pass or fail):"


def stratified_sample(frame: pl.DataFrame, n: int, seed: str = "judge") -> pl.DataFrame:
    """About ``n`` rows, allocated to (length_bucket, shard_id) strata in proportion, at least one per stratum
    while the budget allows; within a stratum the order is a seeded hash, so the sample is reproducible."""
    if frame.height <= n:
        return frame
    keyed = frame.with_columns(
        pl.col("request_id")
        .map_elements(lambda r: hashlib.sha256(f"{seed}:{r}".encode()).hexdigest(), return_dtype=pl.String)
        .alias("_order")
    )
    sizes = keyed.group_by("length_bucket", "shard_id").len().sort("length_bucket", "shard_id")
    total = keyed.height
    quota = {(b, s): max(1, math.floor(c * n / total)) for b, s, c in sizes.iter_rows()}
    parts = []
    for (bucket, shard), rows in keyed.sort("_order").group_by(["length_bucket", "shard_id"], maintain_order=True):
        parts.append(rows.head(quota[(bucket, shard)]))
    taken = pl.concat(parts)
    if taken.height < n:  # rounding down left room: top up in the seeded order
        rest = keyed.join(taken.select("request_id"), on="request_id", how="anti").sort("_order")
        taken = pl.concat([taken, rest.head(n - taken.height)])
    return taken.sort("_order").drop("_order").head(n)


def judge(spec: JobSpec, executor: StreamExecutor, sample: pl.DataFrame, key: str = "judge") -> pl.DataFrame:
    """Grade each (task, answer): request_id, verdict ("pass" / "fail" / None when the judge failed)."""
    assert spec.quality is not None and spec.quality.judge is not None
    cfg = spec.quality.judge
    output = OutputSpec(choice=VERDICTS)
    plan = RequestPlan(
        model=cfg.model or spec.model,
        system=cfg.instructions,
        sampling=SamplingSpec(temperature=0, max_tokens=16),
        output=output,
    )
    prompts = [
        JUDGE_TEMPLATE.format(task=t, answer=a)
        for t, a in zip(sample["user_prompt"].to_list(), sample["answer"].to_list())
    ]
    work = ShardWork(
        spec.name,
        key,
        1,
        f"{spec.name}:{key}:1",
        plan,
        pa.table({"request_id": sample["request_id"].to_list(), "user_prompt": prompts}),
    )
    tables = list(executor.run(work))
    if not tables:
        return sample.select("request_id").with_columns(pl.lit(None, pl.String).alias("verdict"))
    raw = pa.concat_tables(tables)
    verdicts = validate(raw, output)
    graded = pl.DataFrame(
        {"request_id": raw.column("request_id").to_pylist(), "verdict": verdicts.parsed_output.to_pylist()},
        schema={"request_id": pl.String, "verdict": pl.String},
    )
    return sample.select("request_id").join(graded, on="request_id", how="left")


def summarise(graded: pl.DataFrame, truth: pl.DataFrame | None = None) -> dict:
    """Pass rate with its interval; with ``truth`` (request_id, correct), the judge's agreement with it."""
    judged = graded.filter(pl.col("verdict").is_not_null())
    rate: Interval = wilson(int((judged["verdict"] == "pass").sum()), judged.height)
    out = {
        "sampled": graded.height,
        "judged": judged.height,
        "pass_rate": rate.estimate,
        "pass_rate_low": rate.low,
        "pass_rate_high": rate.high,
    }
    if truth is not None and truth.height:
        both = judged.join(truth, on="request_id")
        agree = wilson(int(((both["verdict"] == "pass") == both["correct"]).sum()), both.height)
        out.update(
            {
                "golden_judged": both.height,
                "agreement": agree.estimate,
                "agreement_low": agree.low,
                "agreement_high": agree.high,
            }
        )
    return out
