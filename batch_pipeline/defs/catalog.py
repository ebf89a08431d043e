"""The asset graph of one job, declared once as data: each asset's upstream assets, kinds and description.

``JobFrame.asset_args`` (defs/frame.py) reads an asset's row, so the builder modules (``prepare_assets``,
``shard_assets``, ``publish_assets``, ``evals``) hold only what each asset does. A description is prose wrapped
freely (the UI shows its words joined by single spaces), names the job as ``{job}``, and says what a failure of
the asset means and what fixes it.
"""

from dataclasses import dataclass
from typing import Literal

# how an asset is partitioned: one step per shard (``<job>_shards``), or per week (the weekly eval job)
Partitioning = Literal["shard", "week"]


@dataclass(frozen=True)
class AssetEntry:
    """One asset of a job: the assets of the same job it reads, its kinds, its description, its partitions."""

    deps: tuple[str, ...]
    kinds: tuple[str, ...]
    description: str  # ``{job}`` stands for the job's name
    # the asset of ``input.from_job`` it reads on a later pass of a multi-pass job (the chain shows in the graph)
    upstream_job_asset: str | None = None
    partitions: Partitioning | None = None

    def describe(self, job: str) -> str:
        """The description as the asset carries it: one line, naming ``job``."""
        return " ".join(self.description.split()).replace("{job}", job)


JOB_ASSETS: dict[str, AssetEntry] = {
    "manifest": AssetEntry(
        deps=(),
        kinds=("parquet",),
        description="""
            Every item of job {job}: request IDs, prompts, token estimates, shards; rejects. Fails when the input
            cannot be read at all (the message names the file or field): fix input in the spec, then `batch-pipeline
            run`. A bad row is not a failure: it is a reject (rejects_by_reason).
        """,
        upstream_job_asset="validated",
    ),
    "quote": AssetEntry(
        deps=("manifest",),
        kinds=("python",),
        description="""
            The remaining work priced before any spend: a low/expected/high range per pass, calibrated on measured
            usage, bound to a fingerprint of its inputs, expiring after 30 minutes. Fails on a model with no price
            row (add it to data/prices.yaml); its check quote_within_budget holds every submission while the high
            estimate passes budget_usd.
        """,
    ),
    "backend_comparison": AssetEntry(
        deps=("manifest",),
        kinds=("python",),
        description="""
            The remaining work's request plan quoted on every backend of cost_compare, and the self-hosted
            break-even utilisation; made with the manifest, before anything is spent (`batch-pipeline quote
            --compare` prices the whole job too). A backend or model with no price row is named in its metadata (add
            it to data/prices.yaml or drop it from cost_compare); the job goes on.
        """,
    ),
    "submissions": AssetEntry(
        deps=("quote",),
        kinds=("python",),
        description="""
            Submit each shard's pending items (re-attach to an open batch); self-hosted and online backends run the
            shard inline. A failure is a job stop (bad key, budget, canary, retry cap: the message says which and
            what fixes it, then `batch-pipeline resume`) or a shard that must wait (ShardWaits: the canary, a stale
            quote).
        """,
        partitions="shard",
    ),
    "shard_results": AssetEntry(
        deps=("submissions",),
        kinds=("parquet",),
        description="""
            Collect each shard's ended batches; validate and append results; rescue the tail online near the
            deadline or after an expiry. Fails when the provider failed a batch or refused the job (a job stop:
            `batch-pipeline status` shows why; fix it, then `batch-pipeline resume`); the other shards' ended
            batches are still collected.
        """,
        partitions="shard",
    ),
    "results": AssetEntry(
        deps=("shard_results",),
        kinds=("parquet",),
        description="""
            The staged table: one row per source row, latest valid result of its request. The blocking checks run on
            it; users read the promoted copy, validated. A failed check here keeps the previous validated table:
            each check's description says what it means and what fixes it (README, Troubleshooting).
        """,
    ),
    "validated": AssetEntry(
        deps=("results",),
        kinds=("parquet", "duckdb"),
        description="""
            The validated table users read (Parquet + DuckDB views): the staged table, promoted only when every
            blocking check on results passed. Skipped or failed when one did not pass: the previous table stays; fix
            what the failed check names, then run again.
        """,
    ),
    "dead_letters": AssetEntry(
        deps=("validated",),
        kinds=("parquet",),
        description="""
            Items whose retry budget is spent, with their last error code and message. After a fix, `batch-pipeline
            replay {job} --code CODE` gives them a fresh budget (e.g. --code truncated --max-tokens N).
        """,
    ),
    "report": AssetEntry(
        deps=("validated", "dead_letters"),
        kinds=("python",),
        description="""
            Counts, tokens, cost per accepted item, quoted vs actual spend, per-shard reconciliation. complete false
            means items are still pending: `batch-pipeline status {job}` says why they wait.
        """,
    ),
    # the weekly eval job's (defs/evals.py), partitioned by week
    "eval": AssetEntry(
        deps=(),
        kinds=("python",),
        description="""
            Weekly golden-set accuracy (with its interval) and an optional paired comparison, run inline on
            quality.eval_backend. Fails when that backend is a batch one (name an online or self-hosted backend) or
            refuses the job (the message says why: key, model); a low accuracy is a figure, not a failure.
        """,
        partitions="week",
    ),
    "judge": AssetEntry(
        deps=("results",),
        kinds=("python",),
        description="""
            Weekly: a stratified sample of accepted outputs graded pass/fail by a judge model, with the judge's
            agreement against the golden labels (on the golden probes). Fails when quality.judge.backend is a batch
            backend or refuses the job; a low agreement means the judge cannot be trusted on this task: change
            quality.judge.model or instructions.
        """,
        partitions="week",
    ),
}
