"""Golden-set evaluation: accuracy with an interval, and paired comparisons of two prompts or models.

Sample sizes are decided up front: ``samples_needed`` says how many golden items give the precision
the spec asks for (about +-3 points at 400 items near 90%), and every report states the interval it
actually achieved (Wilson score interval; for a paired difference, the normal interval on discordant pairs).
"""

import math
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pyarrow as pa

from batch_pipeline.core.errors import ConfigError
from batch_pipeline.core.ledger.executor import RequestPlan, ShardWork, StreamExecutor
from batch_pipeline.core.manifest import ids
from batch_pipeline.core.manifest.shards import normalise_fields, render_expr
from batch_pipeline.core.quality.validate import SUCCEEDED, validate
from batch_pipeline.core.spec.job import JobSpec, PromptSpec

Z95 = 1.959964


@dataclass
class Interval:
    estimate: float
    low: float
    high: float

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2


def wilson(successes: int, n: int, z: float = Z95) -> Interval:
    if n == 0:
        return Interval(float("nan"), 0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return Interval(p, max(0.0, centre - half), min(1.0, centre + half))


def samples_needed(expected_accuracy: float, half_width: float, z: float = Z95) -> int:
    """Items needed so that the 95% interval is about +-half_width (normal approximation)."""
    p = expected_accuracy
    return math.ceil(z * z * p * (1 - p) / (half_width * half_width))


@dataclass
class PairedComparison:
    n: int
    a_accuracy: float
    b_accuracy: float
    b_wins: int  # items B got right and A got wrong
    b_losses: int  # items A got right and B got wrong
    ties: int
    difference: Interval  # B - A

    def as_dict(self) -> dict:
        return {
            "n": self.n,
            "a_accuracy": self.a_accuracy,
            "b_accuracy": self.b_accuracy,
            "b_wins": self.b_wins,
            "b_losses": self.b_losses,
            "ties": self.ties,
            "difference": self.difference.estimate,
            "difference_low": self.difference.low,
            "difference_high": self.difference.high,
        }


def paired(a_correct: list[bool], b_correct: list[bool], z: float = Z95) -> PairedComparison:
    n = len(a_correct)
    if n == 0 or n != len(b_correct):
        raise ValueError("paired comparison needs the same non-empty set of items on both sides")
    wins = sum(1 for a, b in zip(a_correct, b_correct) if b and not a)
    losses = sum(1 for a, b in zip(a_correct, b_correct) if a and not b)
    d = (wins - losses) / n
    se = math.sqrt(max(wins + losses - (wins - losses) ** 2 / n, 0.0)) / n
    return PairedComparison(
        n, sum(a_correct) / n, sum(b_correct) / n, wins, losses, n - wins - losses, Interval(d, d - z * se, d + z * se)
    )


def load_golden(spec: JobSpec, prompt: PromptSpec | None = None) -> pl.DataFrame:
    """Golden rows rendered exactly like the manifest renders input rows: golden_id, user_prompt, label."""
    if spec.quality is None:
        raise ConfigError(f"job {spec.name} has no quality.golden set")
    path = Path(spec.quality.golden)
    if not path.is_absolute():
        path = spec.input_base_dir() / path
    try:
        frame = pl.read_ndjson(path)
    except (OSError, pl.exceptions.ComputeError) as exc:
        raise ConfigError(f"{path}: cannot read the golden set: {exc}") from None
    prompt = prompt or spec.prompt
    missing = [f for f in [*prompt.fields, spec.quality.label_field] if f not in frame.columns]
    if missing:
        raise ConfigError(f"{path}: golden rows lack field(s) {missing}")
    rendered = spec.model_copy(update={"prompt": prompt})
    frame = normalise_fields(frame.with_columns(pl.col(f).cast(pl.String) for f in prompt.fields), prompt.fields)
    frame = frame.with_columns(render_expr(rendered).alias("user_prompt"))
    prefix = ids.id_prefix("golden:" + prompt.version, spec.model, rendered.settings_fingerprint())
    return frame.with_row_index("row").select(
        "row",
        pl.Series("golden_id", ids.request_ids(prefix, frame["user_prompt"].to_list())),
        "user_prompt",
        pl.col(spec.quality.label_field).cast(pl.String).alias("label"),
    )


def run_golden(
    spec: JobSpec,
    executor: StreamExecutor,
    golden: pl.DataFrame,
    *,
    model: str | None = None,
    prompt: PromptSpec | None = None,
    key: str = "eval",
) -> pl.DataFrame:
    """Every golden item through a stream executor: golden_id, output, correct, status, tokens."""
    plan = RequestPlan.from_spec(spec)
    plan = RequestPlan(
        model=model or plan.model, system=(prompt or spec.prompt).system, sampling=plan.sampling, output=plan.output
    )
    items = pa.table({"request_id": golden["golden_id"].to_list(), "user_prompt": golden["user_prompt"].to_list()})
    work = ShardWork(spec.name, key, 1, f"{spec.name}:{key}:1", plan, items)
    tables = list(executor.run(work))
    raw = pa.concat_tables(tables) if tables else None
    if raw is None or raw.num_rows == 0:
        return pl.DataFrame(
            schema={
                "row": pl.UInt32,
                "golden_id": pl.String,
                "label": pl.String,
                "output": pl.String,
                "status": pl.String,
                "correct": pl.Boolean,
            }
        )
    verdicts = validate(raw, spec.output)
    outcome = pl.DataFrame(
        {
            "golden_id": raw.column("request_id").to_pylist(),
            "output": verdicts.parsed_output.to_pylist(),
            "status": verdicts.status.to_pylist(),
        }
    )
    joined = golden.select("row", "golden_id", "label").join(outcome, on="golden_id", how="left")
    return joined.with_columns(
        ((pl.col("status") == SUCCEEDED) & (pl.col("output") == pl.col("label"))).fill_null(False).alias("correct")
    )
