"""The job report: counts, tokens, cost, cost per accepted item, timing, where the outputs are."""

from datetime import datetime

import polars as pl

from batch_pipeline.core.run.attempts import AttemptLog
from batch_pipeline.core.quality.golden import GoldenProbes, probe_accuracy
from batch_pipeline.core.manifest.shards import Manifest
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.publish.tables import JobState
from batch_pipeline.core.state.reconcile import counts_by_shard, job_counts
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.state.replay import Replays
from batch_pipeline.core.store import Store


def shard_table(state: JobState) -> list[dict]:
    per_shard = counts_by_shard(state.states)
    return [{"shard": sid, **c.as_dict(), "balanced": c.balanced} for sid, c in sorted(per_shard.items())]


def build_report(spec: JobSpec, store: Store, state: JobState, outputs: dict[str, str] | None = None) -> dict:
    manifest = Manifest(spec.name, store)
    latest = manifest.latest() or {}
    totals = job_counts(counts_by_shard(state.states))
    res = state.results
    cost = float(res["cost_usd"].sum() or 0.0) if res.height else 0.0
    by_pricing = {}
    if res.height:
        for row in res.group_by("pricing").agg(pl.col("cost_usd").sum()).iter_rows(named=True):
            by_pricing[row["pricing"]] = round(row["cost_usd"], 6)
    times: list[datetime] = []
    attempts = 0
    for sid in manifest.shard_ids():
        for a in AttemptLog(store, spec.name, sid).all():
            attempts += 1
            for rec in a.records.values():
                times.append(datetime.fromisoformat(rec["at"]))
    span = (max(times) - min(times)).total_seconds() if times else 0.0
    report = {
        "job": spec.name,
        "model": spec.model,
        "backend": spec.backend.name,
        "prompt_version": spec.prompt.version,
        "input_rows": latest.get("input_rows", 0),
        "rejected_rows": latest.get("rejected_rows", 0),
        "accepted_rows": latest.get("accepted_rows", 0),
        "unique_requests": totals.expected,
        "duplicates_collapsed": latest.get("duplicates_collapsed", 0),
        "shards": len(manifest.shard_ids()),
        "attempts": attempts,
        "succeeded": totals.valid,
        "invalid": totals.invalid,
        "missing": totals.missing,
        "dead_lettered": totals.dead_lettered,
        "complete": totals.valid + totals.dead_lettered == totals.expected,
        "input_tokens": int(res["input_tokens"].sum() or 0) if res.height else 0,
        "cached_tokens": int(res["cached_tokens"].sum() or 0) if res.height else 0,
        "output_tokens": int(res["output_tokens"].sum() or 0) if res.height else 0,
        "requests_sent": res.height,
        "cost_usd": round(cost, 6),
        "cost_by_pricing": by_pricing,
        "cost_per_accepted_item_usd": round(cost / totals.valid, 8) if totals.valid else None,
        "processing_span_s": round(span, 3),
        "outputs": outputs or {},
    }
    report["quoted_vs_actual"] = quoted_vs_actual(spec, store, state)
    report["replays"] = [r.as_dict() for r in Replays(store, spec.name).records()]  # dead letters given a new budget
    report["cost_by_attempt"] = {str(k): round(v, 6) for k, v in
                                 state.results.group_by("attempt").agg(pl.col("cost_usd").sum()).sort("attempt")
                                 .iter_rows()} if res.height else {}
    if state.probe_results is not None and state.probe_results.height:
        probes = GoldenProbes(spec, store).all_probe_ids()
        report["golden_probes_cost_usd"] = round(float(state.probe_results["cost_usd"].sum()), 6)
        report["golden_accuracy_by_shard"] = probe_accuracy(state.probe_results, probes).to_dicts()
        report["cost_usd"] = round(cost + report["golden_probes_cost_usd"], 6)
        report["cost_per_accepted_item_usd"] = (round(report["cost_usd"] / totals.valid, 8) if totals.valid
                                                else None)
    return report


def quoted_vs_actual(spec: JobSpec, store: Store, state: JobState) -> dict:
    """The first quote of the job against what was spent, explained by pass, cache-hit share and tokens."""
    quotes = store.list_files(f"{JobPaths(spec.name).root}/quotes", suffix=".json")
    first = store.read_json(quotes[0]) if quotes else None
    res = state.results
    if first is None or res.height == 0:
        return {}
    first_attempt = res.with_columns((pl.col("attempt") == pl.col("attempt").min().over("request_id")).alias("_first"))
    actual_first = float(first_attempt.filter(pl.col("_first"))["cost_usd"].sum())
    actual_retries = float(first_attempt.filter(~pl.col("_first"))["cost_usd"].sum())
    input_tokens = int(res["input_tokens"].sum())
    passes = first["passes"]
    return {
        "quoted_at": first["created_at"],
        "quoted_usd": first["est_cost_usd"],
        "actual_usd": round(actual_first + actual_retries, 6),
        "first_pass": {"quoted_expected": round(passes["first"]["cost_expected"], 6), "actual": round(actual_first, 6)},
        "retries": {"quoted_expected": round(passes["retries"]["cost_expected"], 6),
                    "actual": round(actual_retries, 6)},
        "input_tokens": {"quoted": passes["first"]["input_tokens"], "actual": input_tokens},
        "output_tokens": {"quoted_expected": passes["first"]["output_tokens_expected"],
                          "actual": int(res["output_tokens"].sum())},
        "cache_hit_share": {"quoted": first["cache_hit_share"],
                            "actual": round(float(res["cached_tokens"].sum()) / max(input_tokens, 1), 4)},
        "calibration_factor_at_quote": first["calibration"]["factor"],
    }


SUMMARY_ROWS = [
    ("input rows", "input_rows"), ("rejected rows", "rejected_rows"), ("unique requests", "unique_requests"),
    ("duplicates collapsed", "duplicates_collapsed"), ("shards", "shards"), ("succeeded", "succeeded"),
    ("invalid", "invalid"), ("missing", "missing"), ("dead-lettered", "dead_lettered"),
    ("tokens in", "input_tokens"), ("tokens out", "output_tokens"), ("cost (USD)", "cost_usd"),
    ("cost per accepted item (USD)", "cost_per_accepted_item_usd"),
]
