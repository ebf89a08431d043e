"""The job report: counts, tokens, cost, cost per accepted item, timing, where the outputs are."""

from collections.abc import Iterable
from datetime import datetime

import polars as pl

from batch_pipeline.core.ledger.attempts import Attempt, AttemptLog
from batch_pipeline.core.ledger.replay import Replays
from batch_pipeline.core.manifest.shards import Manifest
from batch_pipeline.core.money.quote_record import read_quote
from batch_pipeline.core.publish.cascade import pass_costs
from batch_pipeline.core.publish.scan import JobScan
from batch_pipeline.core.publish.tables import JobState
from batch_pipeline.core.quality.golden import GoldenProbes, probe_accuracy
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store


def shard_table(state: JobState) -> list[dict]:
    return [{"shard": sid, **c.as_dict(), "balanced": c.balanced} for sid, c in sorted(state.scan.per_shard.items())]


def build_report(spec: JobSpec, store: Store, state: JobState, outputs: dict[str, str] | None = None) -> dict:
    """The report, from the job's one streaming pass (``JobState.scan``) and the attempt logs."""
    manifest = Manifest(spec.name, store)
    latest = manifest.latest()
    accepted, rejected = manifest.live_counts()
    scan = state.scan
    totals = scan.totals
    cost = scan.cost_usd
    times: list[datetime] = []
    # every shard's attempt log, read once for the timing and the spend range (the intents' heads: no IDs needed)
    logs = [a for sid in manifest.shard_ids() for a in AttemptLog(store, spec.name, sid).all(request_ids=False)]
    attempts = len(logs)
    for a in logs:
        for event, rec in a.records.items():
            if event != "discarded":  # provider housekeeping after the work (maybe at a later publish)
                times.append(datetime.fromisoformat(rec.at))
    span = (max(times) - min(times)).total_seconds() if times else 0.0
    report = {
        "job": spec.name,
        "model": spec.model,
        "backend": spec.backend.name,
        "prompt_version": spec.prompt.version,
        # the job's whole input (every generation's live rows), and what the latest manifest run read anew
        "input_rows": accepted + rejected,
        "new_input_rows": latest.input_rows if latest else 0,
        "rejected_rows": rejected,
        "accepted_rows": accepted,
        "unique_requests": totals.expected,
        "duplicates_collapsed": max(accepted - totals.expected, 0),
        "shards": len(manifest.shard_ids()),
        "attempts": attempts,
        "succeeded": totals.valid,
        "invalid": totals.invalid,
        "missing": totals.missing,
        "dead_lettered": totals.dead_lettered,
        "complete": totals.valid + totals.dead_lettered == totals.expected,
        "input_tokens": scan.input_tokens,
        "cached_tokens": scan.cached_tokens,
        "output_tokens": scan.output_tokens,
        "requests_sent": scan.requests_sent,
        "cost_usd": round(cost, 6),
        "cost_by_pricing": {k: round(v, 6) for k, v in scan.cost_by_pricing.items()},
        "cost_per_accepted_item_usd": round(cost / totals.valid, 8) if totals.valid else None,
        "processing_span_s": round(span, 3),
        "outputs": outputs or {},
    }
    report["quoted_vs_actual"] = quoted_vs_actual(spec, store, scan)
    report["replays"] = [r.as_dict() for r in Replays(store, spec.name).records()]  # dead letters given a new budget
    report["cost_by_attempt"] = {str(k): round(v, 6) for k, v in sorted(scan.cost_by_attempt.items())}
    if spec.input.from_job is not None:  # a later pass: cost per accepted item of each pass and of all of them
        report["cascade"] = pass_costs(spec, store, {"cost_usd": cost, "succeeded": totals.valid})
    if spec.fallback is not None or spec.route is not None:
        report.update(model_costs(spec, store))
    if scan.probe_results is not None and scan.probe_results.height:
        probes = GoldenProbes(spec, store).all_probe_ids()
        report["golden_probes_cost_usd"] = round(float(scan.probe_results["cost_usd"].sum()), 6)
        report["golden_accuracy_by_shard"] = probe_accuracy(scan.probe_results, probes).to_dicts()
        report["cost_usd"] = round(cost + report["golden_probes_cost_usd"], 6)
        report["cost_per_accepted_item_usd"] = round(report["cost_usd"] / totals.valid, 8) if totals.valid else None
    report.update(spend_range(logs, report["cost_usd"]))
    return report


def spend_range(attempts: Iterable[Attempt], recorded: float) -> dict:
    """Spend is recorded cost plus an upper bound, never less than what was billed: requests a hard kill left in
    flight (sent, no answer stored: at most the executor's concurrency per kill) count at their highest cost.
    ``attempts``: every attempt of the job."""
    bound = 0.0
    requests = 0
    for attempt in attempts:
        gone = attempt.abandoned
        if gone is not None:
            bound += gone.possibly_billed_usd or 0.0
            requests += gone.possibly_billed or 0
    return {
        "cost_possibly_billed_usd": round(bound, 6),
        "requests_possibly_billed": requests,
        "cost_range_usd": [round(recorded, 6), round(recorded + bound, 6)],
    }


def model_costs(spec: JobSpec, store: Store) -> dict:
    """Cost by model and by backend, and the fallback's part apart: what it answered and what it cost (only
    jobs that can answer with more than one model or backend read this)."""
    from batch_pipeline.core.ledger.fallback import fallback_backend, is_fallback_row
    from batch_pipeline.core.ledger.result_parts import read_results

    rows = read_results(store, spec.name, columns=["request_id", "attempt", "model", "backend", "status", "cost_usd"])
    out: dict = {
        "cost_by_model": {
            k: round(v, 6) for k, v in rows.group_by("model").agg(pl.col("cost_usd").sum()).sort("model").iter_rows()
        },
        "cost_by_backend": {
            k: round(v, 6)
            for k, v in rows.group_by("backend").agg(pl.col("cost_usd").sum()).sort("backend").iter_rows()
        },
    }
    if spec.route is not None:  # backend: auto: each shard's route, its reason and the cost of each candidate
        from batch_pipeline.core.route.plan import RouteBook

        book = RouteBook(store, spec.name)
        out["route"] = [c.as_dict() for c in (book.get(s) for s in Manifest(spec.name, store).shard_ids()) if c]
    if spec.fallback is not None:
        mine = rows.filter(is_fallback_row(spec))
        backend = fallback_backend(spec)
        out["fallback"] = {
            "model": spec.fallback.model,
            "backend": backend.name if backend else None,
            "requests": mine.height,
            "answered": mine.filter(pl.col("status") == "succeeded")["request_id"].n_unique(),
            "cost_usd": round(float(mine["cost_usd"].sum() or 0.0), 6),
        }
    return out


def quoted_vs_actual(spec: JobSpec, store: Store, scan: JobScan) -> dict:
    """The first quote of the job against what was spent, explained by pass, cache-hit share and tokens."""
    quotes = store.list_files(f"{JobPaths(spec.name).root}/quotes", suffix=".json")
    first = read_quote(store, spec.name, quotes[0]) if quotes else None
    if first is None or scan.requests_sent == 0:
        return {}
    passes = first.passes
    return {
        "quoted_at": first.created_at,
        "quoted_usd": first.est_cost_usd.model_dump(mode="json"),
        "actual_usd": round(scan.cost_usd, 6),
        "first_pass": {
            "quoted_expected": round(passes.first.cost_expected, 6),
            "actual": round(scan.first_try_cost_usd, 6),
        },
        "retries": {
            "quoted_expected": round(passes.retries.cost_expected, 6),
            "actual": round(scan.retry_cost_usd, 6),
        },
        "input_tokens": {"quoted": passes.first.input_tokens, "actual": scan.input_tokens},
        "output_tokens": {"quoted_expected": passes.first.output_tokens_expected, "actual": scan.output_tokens},
        "cache_hit_share": {
            "quoted": first.cache_hit_share.model_dump(mode="json"),
            "actual": round(float(scan.cached_tokens) / max(scan.input_tokens, 1), 4),
        },
        "calibration_factor_at_quote": first.calibration.factor,
    }


SUMMARY_ROWS = [
    ("input rows", "input_rows"),
    ("new input rows (this run)", "new_input_rows"),
    ("rejected rows", "rejected_rows"),
    ("unique requests", "unique_requests"),
    ("duplicates collapsed", "duplicates_collapsed"),
    ("shards", "shards"),
    ("succeeded", "succeeded"),
    ("invalid", "invalid"),
    ("missing", "missing"),
    ("dead-lettered", "dead_lettered"),
    ("tokens in", "input_tokens"),
    ("tokens out", "output_tokens"),
    ("cost (USD)", "cost_usd"),
    ("cost per accepted item (USD)", "cost_per_accepted_item_usd"),
]
