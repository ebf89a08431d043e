"""Publishing at scale: the staged (validated) table, the report and the reconciliation check of a finished job.

Builds a synthetic finished job on local disk (under ``benchmarks/out/publish-<items>``, reused while its build
parameters match), laid out as the pipeline writes it: one items Parquet per shard (``ITEM_SCHEMA``) and one
generation record, one rows part (every source row, 3% of them repeating an earlier row's request), and per
(shard, attempt) a result part and its payload part written by ``write_results`` (an ~850-byte OpenAI line per
row). Attempt 1: 95% succeed, 2.5% invalid output, 2.5% server errors; attempt 2 retries those (90% succeed),
attempt 3 what is left; retries.per_item 3, so a few items end dead-lettered. Shards of 1,000 items.

Variants, each in its own spawned process (peak RSS is that process's ``VmHWM``), timed in one script run:

- streaming (core today): ``JobState.load`` -> ``stage`` (the table by DuckDB over the parts, memory limit 1 GB,
  spilling to a temporary directory; dead letters from the shard-group scan) -> ``build_report`` -> ``cost_over_time``
  of the scan's timeline -> ``state.check()`` (the scan, already done: free);
- whole_frames (the approach before it, as it was, in this file): every item, every result row (all columns but the
  payload: the old read also held the ~850-byte payload of every row, so it was heavier still) and every item's
  state in memory; the validated table joined and sorted in Polars and written; the report's sums and group-bys on
  the whole frames; ``cost_over_time`` of every result row; ``check_invariant`` on the whole frames. Skipped above
  ``--whole-max-items`` (default 10M) or when the machine has less than ``--min-free-gb`` available.

Both must give the same table (row count, cost sum, duplicates) and the same counts; checked.

    python benchmarks/publish_bench.py --items 1000000
    python benchmarks/publish_bench.py --items 10000000 [--whole-max-items 0]
"""

import argparse
import json
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, date, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from benchmarks._harness import OUT, load, maxrss_mb, run_in_child  # noqa: E402

JOB = "publish_bench"
SHARD_ITEMS = 1000
DUPLICATE_ROWS = 0.03
SPEC_YAML = """\
name: {job}
input: {{path: {home}/input.jsonl, text_field: body, key_field: id}}
prompt: {{version: v1, template: "Ticket:\\n{{body}}"}}
model: gpt-4o-mini
backend: {{name: openai_batch}}
sampling: {{temperature: 0, max_tokens: 8}}
output:
  choice: [billing, bug, feature_request, account, other]
retries: {{per_item: 3}}
"""
LABELS = ["billing", "bug", "feature_request", "account", "other"]


# -- build (spawned workers) ----------------------------------------------------------------------
def _build_shards(home: str, numbers: list[int], seed: int) -> int:
    import numpy as np
    import polars as pl
    import pyarrow as pa

    from batch_pipeline.core.ledger.result_parts import write_results
    from batch_pipeline.core.manifest.read import ITEM_SCHEMA
    from batch_pipeline.core.manifest.shards import shard_name
    from batch_pipeline.core.spec.paths import JobPaths
    from batch_pipeline.core.store import Store
    from benchmarks.driver_bench import _result_part

    store, paths = Store(home), JobPaths(JOB)
    rows = 0
    for number in numbers:
        rng = np.random.default_rng(seed * 1_000_003 + number)
        sid = shard_name(number)
        raw = rng.bytes(32 * SHARD_ITEMS)
        ids = sorted(raw[i * 32 : (i + 1) * 32].hex() for i in range(SHARD_ITEMS))
        first_line = (number - 1) * SHARD_ITEMS + 1
        items = pl.DataFrame({"request_id": ids}).select(
            "request_id",
            pl.lit(sid).alias("shard_id"),
            pl.format("ticket {}", "request_id").alias("user_prompt"),
            pl.lit(60, pl.Int32).alias("est_input_tokens"),
            pl.lit(0, pl.Int8).alias("length_bucket"),
            pl.lit(71, pl.Int32).alias("request_bytes"),
            pl.lit("input.jsonl").alias("source"),
            (pl.int_range(pl.len(), dtype=pl.Int64) + first_line).alias("line"),
            pl.lit(1, pl.Int32).alias("generation"),
        )
        store.write_table(paths.shard_items(sid), items.to_arrow().cast(ITEM_SCHEMA))
        labels = np.array(LABELS)[rng.integers(0, len(LABELS), SHARD_ITEMS)]
        pending = np.arange(SHARD_ITEMS)
        now = datetime.now(UTC)
        for attempt, p_ok in ((1, 0.95), (2, 0.90), (3, 0.90)):
            if not len(pending):
                break
            draw = rng.random(len(pending))
            outcome = np.where(draw < p_ok, 0, np.where(draw < (1 + p_ok) / 2, 1, 2))
            part = _result_part(
                [ids[i] for i in pending], outcome.tolist(), labels[pending].tolist(), sid, attempt, now
            )
            write_results(store, JOB, sid, attempt, 1, pa.Table.from_batches(part.to_batches(), part.schema))
            rows += len(pending)
            pending = pending[outcome != 0]
    return rows


def build(items: int, seed: int, workers: int) -> tuple[Path, dict]:
    import multiprocessing as mp

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from batch_pipeline.core.manifest.read import ROW_SCHEMA
    from batch_pipeline.core.manifest.shards import shard_name
    from batch_pipeline.core.spec.paths import JobPaths
    from batch_pipeline.core.store import Store

    home = OUT / f"publish-{items}-seed{seed}"
    meta_path = home / "build.json"
    if meta_path.exists():
        return home, json.loads(meta_path.read_text())
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    (home / "job.yaml").write_text(SPEC_YAML.format(job=JOB, home=home))
    started = time.perf_counter()
    shards = items // SHARD_ITEMS
    numbers = list(range(1, shards + 1))
    chunks = [numbers[i : i + 50] for i in range(0, shards, 50)]
    result_rows = 0
    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as pool:
        for n, r in enumerate(pool.map(_build_shards, [str(home)] * len(chunks), chunks, [seed] * len(chunks)), 1):
            result_rows += r
            if n % max(1, len(chunks) // 10) == 0:
                print(f"  built {n * 50:,} / {shards:,} shards  {time.perf_counter() - started:6.1f} s", flush=True)
    store, paths = Store(home), JobPaths(JOB)
    rng = np.random.default_rng(seed)
    line = items
    source_rows = 0
    repeats: list[pa.Array] = []
    with store.parquet_writer(paths.rows(1), ROW_SCHEMA) as writer:  # every item's row, then the repeats
        for number in numbers:
            t = store.read_part(paths.shard_items(shard_name(number)), ["source", "line", "request_id"])
            writer.write_table(
                pa.table(
                    {
                        "source": t.column("source"),
                        "line": t.column("line"),
                        "source_key": pa.nulls(t.num_rows, pa.string()),
                        "request_id": t.column("request_id"),
                    },
                    schema=ROW_SCHEMA,
                )
            )
            source_rows += t.num_rows
            picks = rng.choice(t.num_rows, int(t.num_rows * DUPLICATE_ROWS), replace=False)
            repeats.append(t.column("request_id").combine_chunks().take(pa.array(picks)))
        rid = pa.concat_arrays(repeats).take(pa.array(rng.permutation(sum(len(r) for r in repeats))))
        n = len(rid)
        writer.write_table(
            pa.table(
                {
                    "source": pa.array(["input.jsonl"] * n),
                    "line": pa.array(np.arange(line + 1, line + n + 1), pa.int64()),
                    "source_key": pa.nulls(n, pa.string()),
                    "request_id": rid,
                },
                schema=ROW_SCHEMA,
            )
        )
        source_rows += n
    store.write_json(
        paths.generation(1),
        {
            "job": JOB,
            "generation": 1,
            "input_files": 1,
            "input_rows": source_rows,
            "rejected_rows": 0,
            "accepted_rows": source_rows,
            "unique_requests": items,
            "new_requests": items,
            "duplicates_collapsed": source_rows - items,
            "shards_total": shards,
            "new_shards": [shard_name(n) for n in numbers],
        },
    )
    meta = {
        "items": items,
        "shards": shards,
        "source_rows": source_rows,
        "result_rows": result_rows,
        "bytes_on_disk": sum(p.stat().st_size for p in home.rglob("*") if p.is_file()),
        "build_seconds": round(time.perf_counter() - started, 1),
    }
    meta_path.write_text(json.dumps(meta, indent=1))
    assert pq.read_metadata(store.local_path(paths.rows(1))).num_rows == source_rows
    return home, meta


# -- variants (spawned children) --------------------------------------------------------------------
def _setup(home: str):
    import pandas  # noqa: F401 - pyarrow imports it on its first Python-value conversion; not publishing

    from batch_pipeline.core.spec.loading import load_spec
    from batch_pipeline.core.store import Store

    return load_spec(Path(home) / "job.yaml"), Store(home)


def streaming(home: str) -> dict:
    from batch_pipeline.core.publish.gate import check_staged
    from batch_pipeline.core.publish.plots import cost_over_time
    from batch_pipeline.core.publish.report import build_report
    from batch_pipeline.core.publish.scan import job_shard_outliers
    from batch_pipeline.core.publish.tables import JobState, stage
    from batch_pipeline.core.spec.paths import JobPaths

    spec, store = _setup(home)
    rss0 = maxrss_mb()
    steps: dict[str, float] = {}
    t0 = t = time.perf_counter()
    state = JobState.load(spec, store)
    stage(spec, store, state)
    steps["stage (table + dead letters; includes the scan)"] = time.perf_counter() - t
    t = time.perf_counter()
    report = build_report(spec, store, state, outputs={})
    cost_over_time(state.scan.timeline)
    steps["report + plot"] = time.perf_counter() - t
    t = time.perf_counter()
    counts = state.check()
    steps["check"] = time.perf_counter() - t
    t = time.perf_counter()
    gate = check_staged(spec, store, JobPaths(spec.name).staged)  # the blocking checks, 200k rows at a time
    steps["gate (pandera per chunk, contract, truncation, duplicate lines)"] = time.perf_counter() - t
    t = time.perf_counter()
    job_shard_outliers(spec, store)
    steps["shard_distributions (a group of shards at a time)"] = time.perf_counter() - t
    seconds = time.perf_counter() - t0
    import pyarrow.parquet as pq

    table = pq.read_table(store.local_path(JobPaths(spec.name).staged), columns=["cost_usd", "is_duplicate"])
    return {
        "variant": "streaming",
        "seconds": seconds,
        "steps": steps,
        "peak_rss_mb": maxrss_mb(),
        "rss_after_imports_mb": rss0,
        "rows": table.num_rows,
        "cost": float(sum(table.column("cost_usd").to_pylist())),
        "duplicates": sum(table.column("is_duplicate").to_pylist()),
        "counts": counts.as_dict(),
        "report_cost": report["cost_usd"],
        "dead_letters": state.scan.dead_letters.height,
        "gate_rows": gate.rows,
        "gate_schema_ok": gate.schema_ok,
    }


def whole_frames(home: str) -> dict:
    """The approach before the streaming one (``JobState.load`` held every row; ``validated_table`` in Polars)."""
    import polars as pl

    from batch_pipeline.core.ledger.reconcile import DEAD, check_invariant, counts_by_shard, item_states, job_counts
    from batch_pipeline.core.ledger.result_parts import PART_SCHEMA, read_results
    from batch_pipeline.core.manifest.read import VALIDATED_COLUMNS
    from batch_pipeline.core.manifest.shards import Manifest
    from batch_pipeline.core.publish.plots import cost_over_time
    from batch_pipeline.core.spec.paths import JobPaths

    spec, store = _setup(home)
    rss0 = maxrss_mb()
    steps: dict[str, float] = {}
    t0 = t = time.perf_counter()
    items = pl.from_arrow(Manifest(spec.name, store).item_index())
    results = read_results(store, spec.name, columns=PART_SCHEMA.names)
    states = item_states(items, results, spec.retries)
    steps["load (items, results, states)"] = time.perf_counter() - t
    t = time.perf_counter()
    rows = pl.from_arrow(Manifest(spec.name, store).rows())
    valid = results.filter(pl.col("status") == "succeeded").sort("attempt").unique("request_id", keep="last")
    table = rows.join(valid.rename({"parsed_output": "output"}), on="request_id", how="inner")
    table = table.sort("source", "line").with_columns(
        pl.col("request_id").is_first_distinct().not_().alias("is_duplicate")
    )
    table = table.with_columns(
        pl.when(pl.col("is_duplicate")).then(0.0).otherwise(pl.col("cost_usd")).alias("cost_usd")
    ).select(VALIDATED_COLUMNS)
    paths = JobPaths(spec.name)
    store.write_table(paths.staged, table.to_arrow())
    dead = states.filter(pl.col("state") == DEAD)
    store.write_table(paths.staged_dead_letters, dead.to_arrow())
    steps["stage (table + dead letters)"] = time.perf_counter() - t
    t = time.perf_counter()
    totals = job_counts(counts_by_shard(states))
    results.group_by("pricing").agg(pl.col("cost_usd").sum())
    results.group_by("attempt").agg(pl.col("cost_usd").sum())
    results.with_columns((pl.col("attempt") == pl.col("attempt").min().over("request_id")).alias("_first"))
    results.select(pl.col("input_tokens").sum(), pl.col("output_tokens").sum(), pl.col("cached_tokens").sum())
    cost_over_time(results)
    steps["report figures + plot"] = time.perf_counter() - t
    t = time.perf_counter()
    counts = check_invariant(items, results, states)
    steps["check"] = time.perf_counter() - t
    return {
        "variant": "whole_frames",
        "seconds": time.perf_counter() - t0,
        "steps": steps,
        "peak_rss_mb": maxrss_mb(),
        "rss_after_imports_mb": rss0,
        "rows": table.height,
        "cost": float(table["cost_usd"].sum()),
        "duplicates": int(table["is_duplicate"].sum()),
        "counts": counts.as_dict(),
        "totals": totals.as_dict(),
        "dead_letters": dead.height,
    }


def _available_gb() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    return 0.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2, help="build processes")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--whole-max-items", type=int, default=10_000_000)
    ap.add_argument("--min-free-gb", type=float, default=12.0, help="skip whole_frames with less memory available")
    args = ap.parse_args(argv)
    home, meta = build(args.items, args.seed, args.workers)
    print(
        f"publish: {meta['items']:,} items in {meta['shards']:,} shards, {meta['source_rows']:,} source rows, "
        f"{meta['result_rows']:,} result rows, {meta['bytes_on_disk'] / 2**30:.1f} GiB on disk "
        f"(built in {meta['build_seconds']} s)",
        flush=True,
    )
    variants = ["streaming"]
    if args.items <= args.whole_max_items and _available_gb() >= args.min_free_gb:
        variants.append("whole_frames")
    elif args.items <= args.whole_max_items:
        print(f"  whole_frames skipped: {_available_gb():.1f} GB available < --min-free-gb {args.min_free_gb}")
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    for _ in range(args.repeat):
        for v in variants:
            r = run_in_child(f"benchmarks.publish_bench:{v}", str(home))
            r["load"] = load()
            runs[v].append(r)
            print(
                f"  {v:12s} {r['seconds']:7.1f} s  peak RSS {r['peak_rss_mb']:7,.0f} MB (after imports "
                f"{r['rss_after_imports_mb']:,.0f})  rows {r['rows']:,}  load {r['load']:.1f}  "
                + ", ".join(f"{k} {s:.1f} s" for k, s in r["steps"].items()),
                flush=True,
            )
    best = {v: min(rs, key=lambda r: r["seconds"]) for v, rs in runs.items()}
    checks = [
        ("streaming: table rows == source rows of answered items", best["streaming"]["rows"] > 0),
        (
            "streaming: counts balanced",
            sum(best["streaming"]["counts"][k] for k in ("valid", "invalid", "missing", "dead_lettered"))
            == best["streaming"]["counts"]["expected"]
            == meta["items"],
        ),
    ]
    if "whole_frames" in best:
        s, w = best["streaming"], best["whole_frames"]
        checks += [
            ("same table rows", s["rows"] == w["rows"]),
            ("same duplicates", s["duplicates"] == w["duplicates"]),
            ("same table cost", abs(s["cost"] - w["cost"]) < 1e-6 * max(1.0, w["cost"])),
            ("same counts", s["counts"] == w["counts"]),
            ("same dead letters", s["dead_letters"] == w["dead_letters"]),
        ]
        print(
            f"  streaming / whole_frames: wall {s['seconds'] / w['seconds']:.2f}x, peak RSS "
            f"{s['peak_rss_mb'] / w['peak_rss_mb']:.2f}x"
        )
    for name, ok in checks:
        print(f"  [{'ok' if ok else 'MISS'}] {name}")
    OUT.mkdir(exist_ok=True)
    (OUT / f"publish_bench-{args.items}.json").write_text(
        json.dumps(
            {"date": date.today().isoformat(), "meta": meta, "runs": runs, "checks": dict(checks)},
            indent=1,
            default=str,
        )
    )
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
