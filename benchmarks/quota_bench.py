"""Quotas (issue 16): N requests through ``batch-pipeline run`` on the sandbox with an enqueued-token cap of 10% of
the job's prompt tokens, against the same job with no cap.

Set-up, as ``e2e_bench.py`` (whose spec, child accounting and input rows it reuses): the demo-shaped choice job on
``openai_batch`` (sandbox), a 300-item canary first; the run and the sandbox are separate children (``wait4``
figures each); a fresh home and Dagster instance per run.

- **The job's prompt tokens** are counted by the sandbox itself on a sample: the first ``--sample`` rows of the
  input run as a job of their own (no cap, default batch timings) on a sandbox of their own, and the sandbox's load
  ledger gives the prompt tokens of every batch it enqueued (the figure its cap counts). Tokens per unique request x
  the input's unique rows (``make_rows``' sidecar) = the job's tokens; the cap is ``--cap-share`` (10%) of it.
  The capped run's own ledger later gives the job's real total, so the cap's share of it is printed as measured.
- **The capped run**: ``batch-pipeline sandbox``'s ``--param quota_enqueued_tokens=CAP --param
  in_progress_s=X`` and the spec's ``backend.settings.quota.enqueued_tokens: CAP`` (so the pipeline admits only
  what fits and nothing is refused). A sandbox batch takes X s (+0.1 s validating and finalizing) on the sandbox
  clock whatever its size; without it batches end at once and no cap binds. X defaults to max(5, the cap's
  requests / ``--cap-rate``): the cap then lets at most ~1,000 requests/s through, below what the whole path
  reaches uncapped on 2 cores, so the cap, not the machine, is what should bind (5 s at 20k rows, 95 s at 1M).
  Shards are sized so that the cap holds ``--per-cap`` (4) of them beside the pipeline's 3% headroom
  (``--shard`` overrides): 456 requests at 20k rows, 22,830 at 1M.
- **The uncapped run**: the same spec without ``quota``, the same sandbox flags without the cap, run first.

Figures, from the capped sandbox's ``GET /_sandbox/load`` (sandbox clock = real time here):

1. utilisation: the time-weighted mean of enqueued tokens / cap from the first enqueue to the last one (after it
   nothing waits to be sent: the drain does not count); also from the first enqueue after the canary ended (the
   canary runs alone by design), with what bounds it: how many median batches fit under cap / 1.03, and the refill
   gap (a batch's release to the next enqueue while shards still waited).
2. items/s of the whole run (succeeded / wall), capped vs uncapped, and the queue phase's rate against the ideal the
   cap allows: cap / mean batch tokens x mean requests per batch / mean batch duration (enqueue to release).
3. refusals (0 expected with the cap configured) and peak enqueued tokens vs the cap.

    python benchmarks/quota_bench.py [--rows 1000000] [--in-progress-s X] [--cap-rate 1000] [--per-cap 4]
        [--shard N] [--cap-share 0.1] [--sample 2000] [--no-uncapped] [--short]

Also printed: both runs' Dagster runs by what they materialized (count x mean seconds, from the run's instance),
which is where a queue turn's time goes. Figures and the capped run's load events go to
``benchmarks/out/quota_bench_<rows>.json``, each run's CLI output to ``benchmarks/out/quota_bench_<rows>/``.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from batch_pipeline.sandbox import SandboxAdmin, start_sandbox_process  # noqa: E402
from benchmarks._harness import OUT, load  # noqa: E402
from benchmarks.e2e_bench import job_spec, wait_child  # noqa: E402
from benchmarks.make_rows import rows_file  # noqa: E402

HEADROOM = 1.03  # QuotaSpec.headroom's default: the pipeline reserves its estimate this much higher
PROVIDER = "openai"


def run_once(label: str, spec: dict, sandbox_args: list[str], log_dir: Path) -> dict:
    """One ``batch-pipeline run`` of ``spec`` against a fresh sandbox started with ``sandbox_args``: wall, the
    report, each child's CPU and peak RSS, and the sandbox's load ledger (read before it stops)."""
    with tempfile.TemporaryDirectory(prefix=f"quota_bench_{label}_") as tmp:
        home, jobs, dagster_home = Path(tmp) / "home", Path(tmp) / "jobs", Path(tmp) / "dagster"
        jobs.mkdir()
        dagster_home.mkdir()
        spec_path = jobs / f"{spec['name']}.yaml"
        spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
        sandbox, url = start_sandbox_process(0, args=sandbox_args)
        env = {
            **os.environ,
            "BATCH_PIPELINE_SANDBOX_URL": url,
            "BATCH_PIPELINE_HOME": str(home),
            "DAGSTER_HOME": str(dagster_home),
            "BATCH_PIPELINE_JOBS": str(jobs),
        }
        log_path = log_dir / f"{label}.log"
        load_before = load()
        with open(log_path, "w") as log:
            start_clock, start = time.time(), time.perf_counter()
            run = subprocess.Popen(
                [sys.executable, "-m", "batch_pipeline.cli", "run", str(spec_path)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
            )
            code, run_cpu, run_rss = wait_child(run)
            wall = time.perf_counter() - start
        ledger = SandboxAdmin(url, timeout=120).load()
        sandbox.terminate()
        _, sandbox_cpu, sandbox_rss = wait_child(sandbox)
        report = json.loads((home / "jobs" / spec["name"] / "report.json").read_text()) if code == 0 else {}
        dagster_runs = run_durations(dagster_home)
    if code != 0:
        tail = log_path.read_text()[-3000:]
        raise RuntimeError(f"{label}: batch-pipeline run exited {code}; the log's tail ({log_path}):\n{tail}")
    return {
        "label": label,
        "wall_s": wall,
        "start_clock": start_clock,
        "succeeded": report.get("succeeded", 0),
        "complete": report.get("complete"),
        "run_cpu_s": run_cpu,
        "run_rss_mb": run_rss,
        "sandbox_cpu_s": sandbox_cpu,
        "sandbox_rss_mb": sandbox_rss,
        "load_avg": [load_before, load()],
        "load": ledger,
        "dagster_runs": dagster_runs,
        "log": str(log_path),
    }


def run_durations(dagster_home: Path) -> dict[str, dict]:
    """The run's Dagster runs by what they materialized (``quote``, ``submissions``, ``shard_results``, ...): how
    many, their total and mean wall seconds (start to end, as the instance recorded them)."""
    import dagster as dg

    out: dict[str, dict] = {}
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        for record in instance.get_run_records():
            steps = record.dagster_run.step_keys_to_execute or []  # "<job>__<asset>"; checks are not steps here
            name = ",".join(sorted({step.split("__")[-1] for step in steps})) or record.dagster_run.job_name
            if record.start_time is None or record.end_time is None:
                continue
            agg = out.setdefault(name, {"runs": 0, "seconds": 0.0})
            agg["runs"] += 1
            agg["seconds"] += record.end_time - record.start_time
    for agg in out.values():
        agg["mean_s"] = agg["seconds"] / agg["runs"]
    return out


def batches(ledger: dict) -> list[dict]:
    """Each batch the sandbox held, in enqueue order: ``enqueue``/``release`` clock times, its tokens and requests
    (the deltas of the ledger's running totals)."""
    out: dict[str, dict] = {}
    before: dict[tuple, tuple[int, int]] = {}
    for e in ledger["events"]:
        if e["provider"] != PROVIDER or e["event"] == "refuse":
            continue
        key = (e["account"], e["model"])
        tokens, requests = before.get(key, (0, 0))
        before[key] = (e["tokens"], e["requests"])
        if e["event"] == "enqueue":
            out[e["batch_id"]] = {
                "batch_id": e["batch_id"],
                "enqueue": e["t"],
                "release": None,
                "tokens": e["tokens"] - tokens,
                "requests": e["requests"] - requests,
            }
        elif e["event"] == "release" and e["batch_id"] in out:
            out[e["batch_id"]]["release"] = e["t"]
    return sorted(out.values(), key=lambda b: b["enqueue"])


def held_between(ledger: dict, start: float, end: float, what: str = "tokens") -> float:
    """Token-seconds (or ``jobs``-seconds: open batches) held over [start, end] of the sandbox clock: the ledger's
    running total (one account and one model here, so an event's total is the provider's) as a step function."""
    steps = [(e["t"], e[what]) for e in ledger["events"] if e["provider"] == PROVIDER and e["event"] != "refuse"]
    total = 0.0
    for (t, held), (t_next, _) in zip(steps, [*steps[1:], (math.inf, 0)]):
        lo, hi = max(t, start), min(t_next, end)
        if hi > lo:
            total += held * (hi - lo)
    return total


def figures(ledger: dict, cap: int, canary_size: int) -> dict:
    """Utilisation, batch shape, ideal rate and the two bounds on utilisation, from one run's load ledger."""
    bs = batches(ledger)
    assert bs and all(b["release"] is not None for b in bs), "a batch never ended"
    first, last_enqueue = bs[0]["enqueue"], bs[-1]["enqueue"]
    canary = bs[0] if bs[0]["requests"] <= canary_size else None
    rest = bs[1:] if canary else bs
    queue_start = rest[0]["enqueue"] if rest else first

    def utilisation(start: float) -> float | None:
        return (
            held_between(ledger, start, last_enqueue) / (cap * (last_enqueue - start)) if last_enqueue > start else None
        )

    mean_tokens = sum(b["tokens"] for b in rest) / len(rest)
    mean_requests = sum(b["requests"] for b in rest) / len(rest)
    duration = sum(b["release"] - b["enqueue"] for b in rest) / len(rest)
    ideal = cap / mean_tokens * mean_requests / duration
    full = sorted(b["tokens"] for b in rest)[len(rest) // 2]  # a typical (median) shard's batch
    fit = math.floor(cap / (HEADROOM * full))  # such batches the pipeline's reservations let in at once
    # refill gaps: each release before the last enqueue, to the next enqueue after it
    enqueues = [b["enqueue"] for b in rest]
    gaps = []
    for b in rest:
        if b["release"] < last_enqueue:
            nxt = next(t for t in enqueues if t >= b["release"])
            gaps.append(nxt - b["release"])
    # Little's law over the queue phase: L batches open on average, each open ``duration``, in ``fit`` slots, so a
    # slot's cycle is duration + its wait for the next batch, and L / fit = duration / (duration + wait)
    in_flight = held_between(ledger, queue_start, last_enqueue, "jobs") / max(last_enqueue - queue_start, 1e-9)
    slot_wait = duration * (fit / in_flight - 1) if in_flight else math.inf
    last_release = max(b["release"] for b in rest)
    queue_requests = sum(b["requests"] for b in rest)
    peak = max((p["tokens"] for p in ledger["peak"] if p["provider"] == PROVIDER), default=0)
    return {
        "batches": len(bs),
        "canary_requests": canary["requests"] if canary else 0,
        "utilisation": utilisation(first),
        "utilisation_queue": utilisation(queue_start),
        "span_s": last_enqueue - first,
        "queue_span_s": last_enqueue - queue_start,
        "canary_phase_s": queue_start - first,
        "mean_batch_tokens": mean_tokens,
        "mean_batch_requests": mean_requests,
        "batch_duration_s": duration,
        "ideal_items_per_s": ideal,
        "median_batch_tokens": full,
        "fit": fit,
        "fit_bound": fit * full / cap,
        "refill_gap_mean_s": sum(gaps) / len(gaps) if gaps else 0.0,
        "refill_gap_max_s": max(gaps, default=0.0),
        "refills": len(gaps),
        "mean_in_flight": in_flight,
        "slot_wait_s": slot_wait,
        "queue_phase_s": last_release - queue_start,
        "queue_requests": queue_requests,
        "queue_items_per_s": queue_requests / (last_release - queue_start),
        "job_tokens": sum(b["tokens"] for b in bs),
        "peak_tokens": peak,
        "refusals": ledger["refusals"],
        "first_enqueue": first,
    }


def sample_tokens(path: Path, sample: int, work: Path) -> tuple[float, int]:
    """Prompt tokens per unique request as the sandbox counts them, on the input's first ``sample`` rows run as a job
    of their own (no cap, default timings); (tokens per request, requests counted)."""
    sample_path = work / "sample.jsonl"
    with open(path, "rb") as src, open(sample_path, "wb") as dst:
        for _, line in zip(range(sample), src):
            dst.write(line)
    r = run_once("sample", job_spec("quota_sample", sample_path, 50_000), [], work)
    bs = batches(r["load"])
    requests = sum(b["requests"] for b in bs)
    return sum(b["tokens"] for b in bs) / requests, requests


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--cap-share", type=float, default=0.10, help="the cap as a share of the job's prompt tokens")
    ap.add_argument(
        "--in-progress-s",
        type=float,
        default=None,
        help="sandbox in_progress_s, a batch's processing (default: max(5, the cap's requests / --cap-rate))",
    )
    ap.add_argument(
        "--cap-rate",
        type=float,
        default=1_000.0,
        help="requests per second the cap lets through at most (sets the default in_progress_s)",
    )
    ap.add_argument("--per-cap", type=int, default=4, help="shards the cap holds at once (sizes the shards)")
    ap.add_argument("--shard", type=int, default=None, help="requests per shard (default: from --per-cap)")
    ap.add_argument("--sample", type=int, default=2_000, help="rows the sandbox counts tokens on")
    ap.add_argument("--no-uncapped", action="store_true", help="skip the uncapped comparison run")
    ap.add_argument("--short", action="store_true", help="~300-character rows (make_rows --short)")
    args = ap.parse_args(argv)
    path, meta = rows_file(args.rows, short=args.short)
    unique = meta.get("unique", args.rows)
    with open(path, "rb") as f:  # warm the page cache: neither run pays the first read
        while f.read(64 * 2**20):
            pass
    log_dir = OUT / f"quota_bench_{args.rows}"
    log_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    per_request, counted = sample_tokens(path, min(args.sample, args.rows), log_dir)
    job_tokens_est = per_request * unique
    cap = int(job_tokens_est * args.cap_share)
    cap_requests = unique * args.cap_share
    shard = args.shard or max(1, int(cap_requests / (args.per_cap * HEADROOM * 1.01)))
    if args.in_progress_s is None:
        args.in_progress_s = round(max(5.0, cap_requests / args.cap_rate), 1)
    print(
        f"quota bench: {args.rows:,} rows ({unique:,} unique), shards of {shard:,}, in_progress_s "
        f"{args.in_progress_s:g}"
    )
    print(
        f"  job tokens (sandbox's count on {counted:,} sample requests: {per_request:.1f} per request) "
        f"~{job_tokens_est:,.0f}; cap {args.cap_share:.0%} = {cap:,} tokens",
        flush=True,
    )

    timing = ["--param", f"in_progress_s={args.in_progress_s:g}"]
    base = job_spec("quota", path, shard)
    canary_size = base["canary"]["size"]
    results = {}
    if not args.no_uncapped:
        results["uncapped"] = run_once("uncapped", base, timing, log_dir)
        _print_run(results["uncapped"])
    capped_spec = {
        **base,
        "backend": {**base["backend"], "settings": {**base["backend"]["settings"], "quota": {"enqueued_tokens": cap}}},
    }
    results["capped"] = run_once("capped", capped_spec, [*timing, "--param", f"quota_enqueued_tokens={cap}"], log_dir)
    _print_run(results["capped"])
    fig = figures(results["capped"]["load"], cap, canary_size)
    capped = results["capped"]
    capped_rate = capped["succeeded"] / capped["wall_s"]
    print(
        f"  job tokens (the capped run's ledger) {fig['job_tokens']:,}: the cap is "
        f"{cap / fig['job_tokens']:.2%} of them; {fig['batches']} batches "
        f"(canary {fig['canary_requests']} requests), mean {fig['mean_batch_requests']:,.0f} requests / "
        f"{fig['mean_batch_tokens']:,.0f} tokens, {fig['batch_duration_s']:.2f} s enqueue to release"
    )
    print(
        f"  (1) utilisation {fig['utilisation']:.1%} over {fig['span_s']:.1f} s (first enqueue to last); "
        f"{fig['utilisation_queue']:.1%} over the {fig['queue_span_s']:.1f} s after the canary "
        f"({fig['canary_phase_s']:.1f} s alone)   target >= 90%: "
        f"{'met' if fig['utilisation'] >= 0.9 else 'NOT met'}"
    )
    print(
        f"      bounds: {fig['fit']} median batches ({fig['median_batch_tokens']:,} tokens) fit under cap / "
        f"{HEADROOM} = {fig['fit_bound']:.1%} of the cap; refill gap (a release to the next enqueue) mean "
        f"{fig['refill_gap_mean_s']:.2f} s, max {fig['refill_gap_max_s']:.2f} s over {fig['refills']} releases"
    )
    print(
        f"      {fig['mean_in_flight']:.2f} batches open on average after the canary, of {fig['fit']} that fit: a "
        f"freed slot waits {fig['slot_wait_s']:.1f} s for its next batch, against {fig['batch_duration_s']:.1f} s "
        "of batch"
    )
    print(f"  (2) items/s: capped {capped_rate:,.0f} (wall {capped['wall_s']:.1f} s)", end="")
    if "uncapped" in results:
        un = results["uncapped"]
        un_rate = un["succeeded"] / un["wall_s"]
        print(
            f", uncapped {un_rate:,.0f} (wall {un['wall_s']:.1f} s): capped/uncapped {capped_rate / un_rate:.2f}x",
            end="",
        )
    ideal = fig["ideal_items_per_s"]
    print(
        f"\n      queue phase {fig['queue_items_per_s']:,.0f} items/s ({fig['queue_requests']:,} requests in "
        f"{fig['queue_phase_s']:.1f} s, first enqueue after the canary to the last release) vs ideal "
        f"{ideal:,.0f} (cap / mean batch tokens x requests per batch / batch duration): "
        f"{fig['queue_items_per_s'] / ideal:.1%}; whole run {capped_rate / ideal:.1%} of it"
    )
    print(
        f"  (3) refusals {fig['refusals']} (expected 0: {'ok' if fig['refusals'] == 0 else 'MISS'}); peak "
        f"{fig['peak_tokens']:,} tokens = {fig['peak_tokens'] / cap:.1%} of the cap "
        f"({'ok' if fig['peak_tokens'] <= cap else 'PASSED'})"
    )
    for label, r in results.items():
        print(
            f"  Dagster runs of the {label} run: "
            + ", ".join(f"{name} {d['runs']} x {d['mean_s']:.2f} s" for name, d in sorted(r["dagster_runs"].items()))
        )
    print(f"  bench wall {time.perf_counter() - started:.0f} s; logs in {log_dir}")
    out = {
        "rows": args.rows,
        "unique": unique,
        "shard": shard,
        "in_progress_s": args.in_progress_s,
        "cap": cap,
        "sample_tokens_per_request": per_request,
        "figures": fig,
        "runs": {k: {kk: vv for kk, vv in v.items() if kk != "load"} for k, v in results.items()},
        "load_events": results["capped"]["load"]["events"],
    }
    (OUT / f"quota_bench_{args.rows}.json").write_text(json.dumps(out, indent=1))
    ok = fig["refusals"] == 0 and fig["peak_tokens"] <= cap and capped["complete"]
    return 0 if ok else 1


def _print_run(r: dict) -> None:
    print(
        f"  {r['label']:8s} wall {r['wall_s']:6.1f} s  {r['succeeded'] / r['wall_s']:>7,.0f} items/s  succeeded "
        f"{r['succeeded']:,}  complete {r['complete']}  run CPU {r['run_cpu_s']:.1f} s / {r['run_rss_mb']:,.0f} MB"
        f"  sandbox CPU {r['sandbox_cpu_s']:.1f} s / {r['sandbox_rss_mb']:,.0f} MB  load "
        f"{r['load_avg'][0]:.1f}-{r['load_avg'][1]:.1f}",
        flush=True,
    )


if __name__ == "__main__":
    raise SystemExit(main())
