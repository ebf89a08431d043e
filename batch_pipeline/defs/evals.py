"""The weekly eval: weekly partitioned assets (one job, one schedule) that run the golden set, optionally a
paired comparison of two prompts or models, and keep the history as a table and a plot; with ``quality.judge``,
the same job grades a stratified sample of accepted outputs with a judge model."""

import base64

import dagster as dg
import polars as pl

from batch_pipeline.core.ledger.executor import StreamExecutor
from batch_pipeline.core.manifest.shards import Manifest
from batch_pipeline.core.publish.plots import accuracy_history
from batch_pipeline.core.publish.tables import JobState
from batch_pipeline.core.quality.evals import load_golden, paired, run_golden, samples_needed, wilson
from batch_pipeline.core.quality.judge import judge, stratified_sample, summarise
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.defs.frame import WEEKLY, JobFrame
from batch_pipeline.defs.metadata import md_table, spec_labels
from batch_pipeline.defs.resources import StoreResource
from batch_pipeline.executors.registry import create_executor


def stream_executor(backend, what: str) -> StreamExecutor:
    """The inline executor an eval or a judge runs on; a Failure naming the key when it is a batch backend."""
    executor = create_executor(backend)
    if not isinstance(executor, StreamExecutor):
        raise dg.Failure(
            f"{what} {backend.name!r} must be an online or self-hosted backend "
            "(evals run inline, not through a 24-hour batch)"
        )
    return executor


def golden_row(spec: JobSpec, executor: StreamExecutor, week: str) -> tuple[dict, dict]:
    """This week's golden-set figures (one history row) and, with ``quality.compare``, the paired comparison's
    metadata."""
    quality = spec.quality
    assert quality is not None
    a = run_golden(spec, executor, load_golden(spec), key=f"eval-{week}")
    acc = wilson(int(a["correct"].sum()), a.height)
    row = {
        "week": week,
        "model": spec.model,
        "prompt_version": spec.prompt.version,
        "n": a.height,
        "accuracy": acc.estimate,
        "accuracy_low": acc.low,
        "accuracy_high": acc.high,
        "samples_needed": samples_needed(min(max(acc.estimate, 0.5), 0.99), quality.target_half_width),
    }
    if quality.compare is None:
        return row, {}
    prompt_b = quality.compare.prompt or spec.prompt
    b = run_golden(
        spec,
        executor,
        load_golden(spec, prompt_b),
        model=quality.compare.model,
        prompt=prompt_b,
        key=f"eval-b-{week}",
    )
    pair = paired(a.sort("row")["correct"].to_list(), b.sort("row")["correct"].to_list())
    row.update(
        {
            "b_model": quality.compare.model or spec.model,
            "b_prompt_version": prompt_b.version,
            "b_accuracy": pair.b_accuracy,
            "difference": pair.difference.estimate,
            "difference_low": pair.difference.low,
            "difference_high": pair.difference.high,
            "b_wins": pair.b_wins,
            "b_losses": pair.b_losses,
        }
    )
    return row, {"comparison": dg.MetadataValue.json(pair.as_dict())}


def write_history(st, paths: JobPaths, row: dict) -> tuple[pl.DataFrame, bytes]:
    """The eval history with this week's row (replacing an earlier run of the same week), and its plot."""
    rel = f"{paths.root}/evals/history.parquet"
    old = pl.read_parquet(st.read_bytes(rel)) if st.exists(rel) else None
    history = pl.DataFrame([row])
    if old is not None:
        history = pl.concat([old.filter(pl.col("week") != row["week"]), history], how="diagonal_relaxed")
    history = history.sort("week")
    st.write_table(rel, history.to_arrow())
    png = accuracy_history(history)
    st.write_bytes(f"{paths.root}/evals/history.png", png)
    return history, png


def eval_asset(frame: JobFrame) -> dg.AssetsDefinition:
    spec, paths = frame.spec, frame.paths
    assert spec.quality is not None
    quality = spec.quality

    @dg.asset(**frame.asset_args("eval"))  # partitioned by week
    def weekly_eval(context: dg.AssetExecutionContext, store: StoreResource) -> dg.MaterializeResult:
        st = store.get()
        executor = stream_executor(quality.eval_backend, "quality.eval_backend")
        row, meta = golden_row(spec, executor, context.partition_key)
        history, png = write_history(st, paths, row)
        acc_low, acc_high, n = row["accuracy_low"], row["accuracy_high"], row["n"]
        context.log.info(
            f"week {row['week']}: accuracy {row['accuracy']:.3f} [{acc_low:.3f}, {acc_high:.3f}] on "
            f"{n} golden items ({row['samples_needed']} needed for +-{quality.target_half_width})"
        )
        meta.update(
            {
                "accuracy": dg.MetadataValue.float(row["accuracy"]),
                "interval": dg.MetadataValue.text(f"[{acc_low:.3f}, {acc_high:.3f}] (95%, n={n})"),
                "samples_needed": dg.MetadataValue.int(row["samples_needed"]),
                "history": md_table(history.select("week", "n", "accuracy", "accuracy_low", "accuracy_high"), limit=60),
                "plot": dg.MetadataValue.md(f"![history](data:image/png;base64,{base64.b64encode(png).decode()})"),
                "plot_path": dg.MetadataValue.path(st.uri(f"{paths.root}/evals/history.png")),
            }
        )
        return dg.MaterializeResult(metadata=meta)

    return weekly_eval


def build_eval_defs(spec: JobSpec) -> tuple[list, list, list]:
    """(assets, jobs, schedules) for a job with a golden set; nothing otherwise."""
    if spec.quality is None:
        return [], [], []
    frame = JobFrame(spec)  # its asset table's rows; the eval assets read no settings
    assets = [eval_asset(frame)]
    if spec.quality.judge is not None:  # graded in the same weekly run as the eval
        assets.append(build_judge_asset(frame))
    job = dg.define_asset_job(
        f"{spec.name}_eval",
        selection=assets,
        partitions_def=WEEKLY,
        **spec_labels(spec),
        description="The weekly golden-set eval" + (" and judge sample." if len(assets) > 1 else "."),
    )
    schedule = dg.build_schedule_from_partitioned_job(job, hour_of_day=6, name=f"{spec.name}_weekly_eval")
    return assets, [job], [schedule]


def judge_pool(spec: JobSpec, st, state: JobState) -> pl.DataFrame:
    """The accepted outputs a judge may sample: request, shard, length bucket, prompt and answer."""
    items = state.items.join(
        pl.from_arrow(Manifest(spec.name, st).item_index(["request_id", "user_prompt"])), on="request_id"
    )
    accepted = (
        state.results.filter(pl.col("status") == "succeeded")
        .sort("attempt")
        .unique("request_id", keep="last")
        .select("request_id", pl.col("output_text").alias("answer"))
    )
    return items.join(accepted, on="request_id").select(
        "request_id", "shard_id", "length_bucket", "user_prompt", "answer"
    )


def with_golden_probes(st, paths: JobPaths, state: JobState, sample: pl.DataFrame):
    """The sample plus the answered golden probes (graded too, to measure the judge), and the probes' truth (None
    without probes)."""
    probes = state.probe_results
    if probes is None or not probes.height:
        return sample, None
    known = pl.concat(
        [pl.read_parquet(st.read_bytes(p)) for p in st.list_files(f"{paths.root}/golden/probes", suffix=".parquet")]
    )
    answered = probes.filter(pl.col("status") != "errored").sort("attempt").unique("request_id", keep="last")
    golden = answered.join(known.select("request_id", "user_prompt", "label"), on="request_id")
    truth = golden.select("request_id", (pl.col("parsed_output") == pl.col("label")).alias("correct"))
    sample = pl.concat(
        [
            sample.select("request_id", "user_prompt", "answer"),
            golden.select("request_id", "user_prompt", pl.col("output_text").alias("answer")),
        ]
    )
    return sample, truth


def judge_metadata(summary: dict, strata: pl.DataFrame) -> dict:
    return {
        **{
            k: dg.MetadataValue.float(float(v)) if isinstance(v, float) else dg.MetadataValue.int(int(v))
            for k, v in summary.items()
            if k != "week"
        },
        "strata": md_table(strata, limit=100),
    }


def build_judge_asset(frame: JobFrame) -> dg.AssetsDefinition:
    spec, paths = frame.spec, frame.paths
    assert spec.quality is not None and spec.quality.judge is not None
    cfg = spec.quality.judge

    @dg.asset(**frame.asset_args("judge"))  # partitioned by week
    def judge_sample(context: dg.AssetExecutionContext, store: StoreResource) -> dg.MaterializeResult:
        st = store.get()
        executor = create_executor(cfg.backend)
        if not isinstance(executor, StreamExecutor):
            raise dg.Failure(f"quality.judge.backend {cfg.backend.name!r} must be an online or self-hosted backend")
        state = JobState.load(spec, st)
        pool = judge_pool(spec, st, state)
        sample, truth = with_golden_probes(st, paths, state, stratified_sample(pool, cfg.sample_size))
        graded = judge(
            spec, executor, sample.select("request_id", "user_prompt", "answer"), key=f"judge-{context.partition_key}"
        )
        items_graded = graded.join(pool.select("request_id"), on="request_id", how="semi")
        summary: dict = {"week": context.partition_key, **summarise(items_graded)}
        if truth is not None:
            summary.update({k: v for k, v in summarise(graded, truth).items() if k.startswith(("golden", "agree"))})
        strata = (
            sample.join(pool.select("request_id", "shard_id", "length_bucket"), on="request_id")
            .group_by("shard_id", "length_bucket")
            .len()
            .sort("shard_id", "length_bucket")
        )
        st.write_json(f"{paths.root}/judge.json", summary)
        st.write_table(f"{paths.root}/judge/verdicts.parquet", graded.to_arrow())
        context.log.info(
            f"judge: pass rate {summary['pass_rate']:.3f} on {summary['judged']} sampled outputs"
            + (f", agreement with golden {summary['agreement']:.3f}" if "agreement" in summary else "")
        )
        return dg.MaterializeResult(metadata=judge_metadata(summary, strata))

    return judge_sample
