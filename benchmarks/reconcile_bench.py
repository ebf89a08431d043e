"""Reconciliation throughput: item states, per-shard counts and the invariant over 1M items.

Synthetic data (deterministic): ``--items`` request IDs over ``--shards`` shards, and results over 1-3
attempts per item: attempt 1 succeeds for ~88% of items, is invalid for ~4%, errored for ~6% (transient,
poison or systemic; some ``batch_expired``), and ~2% of items have no result yet; failed items get a
second and third attempt with their own mix. So every state (valid, invalid, missing, dead_lettered)
occurs.

Measured:
1. in memory, Polars frames: ``item_states`` + ``counts_by_shard`` + ``check_invariant`` (target < 1 s);
2. from the store: the same results written as Parquet parts per (shard, attempt) with ``write_results``
   (full ``RESULT_SCHEMA`` rows with realistic payloads) and the items as manifest shard files, then
   ``read_results`` (state columns, as the runner reads them, and all columns), ``read_results`` of one
   shard (what ``pending_items`` does), ``Manifest.item_index`` and the whole reconcile from the store.

``--breakdown`` also times the steps inside those functions and the plain formulations they replaced.

    python benchmarks/reconcile_bench.py [--items 1000000] [--shards 200] [--repeat 5] [--breakdown]
"""

import argparse
import json
import shutil
import sys
import tempfile
import time
from datetime import UTC, date, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402
import pyarrow as pa  # noqa: E402

from batch_pipeline.core.ledger.reconcile import check_invariant, counts_by_shard, item_states  # noqa: E402
from batch_pipeline.core.ledger.result_parts import RESULT_SCHEMA, read_results, write_results  # noqa: E402
from batch_pipeline.core.manifest.shards import ITEM_SCHEMA, Manifest, shard_name  # noqa: E402
from batch_pipeline.core.run.runner import STATE_COLUMNS  # noqa: E402
from batch_pipeline.core.spec.paths import JobPaths  # noqa: E402
from batch_pipeline.core.store import Store  # noqa: E402
from benchmarks._harness import OUT, maxrss_mb, raw_payload_expr, repeat, summary  # noqa: E402

JOB = "reconcile_bench"
BUDGET = 3
LABELS = ["billing", "bug", "feature_request", "account", "other"]
# per attempt: P(succeeded), P(invalid), P(errored); the rest has no result row (missing)
ATTEMPT_MIX = {1: (0.88, 0.04, 0.06), 2: (0.70, 0.10, 0.20), 3: (0.50, 0.20, 0.30)}
P_RETRY = {2: 0.9, 3: 0.8}  # a failed item gets a next attempt with this probability
ERRORS = [  # (error_class, error_code, message, weight)
    ("transient", "batch_expired", "This request could not be executed before the completion window expired.", 3),
    ("transient", "server_error", "The server had an error while processing your request.", 2),
    ("poison", "context_length_exceeded", "This model's maximum context length is 128000 tokens.", 3),
    ("poison", "http_400", "Invalid 'messages[1].content': string too long.", 1),
    ("systemic", "invalid_api_key", "Incorrect API key provided.", 1),
]
INVALID = [
    ("invalid_output", "contract_violation", 'output \'{"label": "spam"}\' is not one of the allowed labels'),
    ("invalid_output", "truncated", "output hit max_tokens (finish_reason=length)"),
]


def make_data(n_items: int, n_shards: int, seed: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    rng = np.random.default_rng(seed)
    raw = rng.bytes(32 * n_items)
    rids = [raw[i * 32 : (i + 1) * 32].hex() for i in range(n_items)]
    per_shard = -(-n_items // n_shards)
    shard_no = np.arange(n_items) // per_shard + 1
    names = np.array([shard_name(s) for s in range(1, n_shards + 2)])
    items = pl.DataFrame({"request_id": rids, "shard_id": names[shard_no - 1]})
    frames = []
    active = np.ones(n_items, dtype=bool)  # items that get this attempt
    err_w = np.array([e[3] for e in ERRORS], float)
    err_w /= err_w.sum()
    for attempt in (1, 2, 3):
        if attempt > 1:
            active &= rng.random(n_items) < P_RETRY[attempt]
        ps, pi, pe = ATTEMPT_MIX[attempt]
        u = rng.random(n_items)
        status = np.where(u < ps, 0, np.where(u < ps + pi, 1, np.where(u < ps + pi + pe, 2, 3)))
        idx = np.nonzero(active & (status < 3))[0]
        st = status[idx]
        err = rng.choice(len(ERRORS), size=len(idx), p=err_w)
        inv = rng.integers(0, len(INVALID), size=len(idx))
        cls_lut = [e[0] for e in ERRORS]
        code_lut = [e[1] for e in ERRORS]
        msg_lut = [e[2] for e in ERRORS]
        status_s = np.array(["succeeded", "invalid", "errored"])[st]
        eclass = np.where(
            st == 0, None, np.where(st == 1, np.array([x[0] for x in INVALID])[inv], np.array(cls_lut)[err])
        )
        ecode = np.where(
            st == 0, None, np.where(st == 1, np.array([x[1] for x in INVALID])[inv], np.array(code_lut)[err])
        )
        emsg = np.where(
            st == 0, None, np.where(st == 1, np.array([x[2] for x in INVALID])[inv], np.array(msg_lut)[err])
        )
        frames.append(
            pl.DataFrame(
                {
                    "request_id": items["request_id"].gather(idx),
                    "shard_id": items["shard_id"].gather(idx),
                    "attempt": pl.Series(np.full(len(idx), attempt, np.int32)),
                    "status": pl.Series(status_s, dtype=pl.String),
                    "error_class": pl.Series(eclass.tolist(), dtype=pl.String),
                    "error_code": pl.Series(ecode.tolist(), dtype=pl.String),
                    "error_message": pl.Series(emsg.tolist(), dtype=pl.String),
                    "label": pl.Series(np.array(LABELS)[rng.integers(0, 5, len(idx))]),
                    "model": pl.Series(np.full(len(idx), "gpt-4o-mini"), dtype=pl.String),  # in STATE_COLUMNS
                    "backend": pl.Series(np.full(len(idx), "openai_batch"), dtype=pl.String),
                }
            )
        )
        # the next attempt goes only to items that did not succeed here
        succeeded_now = np.zeros(n_items, dtype=bool)
        succeeded_now[idx[st == 0]] = True
        active &= ~succeeded_now
    results = pl.concat(frames)
    return items, results


def full_results(part: pl.DataFrame, shard_id: str, attempt: int, now: datetime) -> pa.Table:
    """RESULT_SCHEMA rows with realistic payloads for one (shard, attempt) part."""
    ok = pl.col("status") == "succeeded"
    frame = part.select(
        "request_id",
        pl.lit(shard_id).alias("shard_id"),
        pl.col("attempt").cast(pl.Int32),
        pl.lit("openai_batch").alias("backend"),
        pl.lit("batch").alias("pricing"),
        pl.lit("gpt-4o-mini").alias("model"),
        pl.lit("v1").alias("prompt_version"),
        "status",
        pl.when(pl.col("error_class") == "transient")
        .then(None)
        .otherwise(pl.format('{{"label": "{}"}}', "label"))
        .alias("output_text"),
        pl.when(ok).then(pl.col("label")).otherwise(None).alias("parsed_output"),
        pl.when(pl.col("error_code") == "truncated")
        .then(pl.lit("length"))
        .otherwise(pl.lit("stop"))
        .alias("finish_reason"),
        pl.lit(231, pl.Int64).alias("input_tokens"),
        pl.lit(0, pl.Int64).alias("cached_tokens"),
        pl.lit(0, pl.Int64).alias("cache_write_tokens"),
        pl.lit(7, pl.Int64).alias("output_tokens"),
        pl.lit(0.0000215).alias("cost_usd"),
        "error_class",
        "error_code",
        "error_message",
        pl.lit(f"batch_{shard_id}_{attempt}").alias("provider_batch_id"),
        pl.format("req_{}", pl.col("request_id").str.slice(0, 32)).alias("provider_request_id"),
        raw_payload_expr(),
        pl.lit(now).dt.replace_time_zone("UTC").alias("recorded_at"),
    )
    table = frame.to_arrow()
    for field in RESULT_SCHEMA:  # columns a chat job leaves null (an embeddings job's vectors)
        if field.name not in table.column_names:
            table = table.append_column(field.name, pa.nulls(table.num_rows, field.type))
    return table.cast(RESULT_SCHEMA)


def write_store(store: Store, items: pl.DataFrame, results: pl.DataFrame) -> dict:
    paths = JobPaths(JOB)
    t = time.perf_counter()
    shard_ids = []
    prompt = "x" * 200
    for (sid,), part in items.partition_by("shard_id", as_dict=True, maintain_order=True).items():
        table = (
            part.sort("request_id")
            .select(
                "request_id",
                "shard_id",
                pl.lit(prompt).alias("user_prompt"),
                pl.lit(60, pl.Int32).alias("est_input_tokens"),
                pl.lit(2, pl.Int8).alias("length_bucket"),
                pl.lit(200, pl.Int32).alias("request_bytes"),
                pl.lit("input.jsonl").alias("source"),
                pl.lit(0, pl.Int64).alias("line"),
                pl.lit(1, pl.Int32).alias("generation"),
            )
            .to_arrow()
            .cast(ITEM_SCHEMA)
        )
        store.write_table(paths.shard_items(sid), table)
        shard_ids.append(sid)
    store.write_json(paths.generation(1), {"generation": 1, "new_shards": shard_ids, "job": JOB})
    items_s = time.perf_counter() - t
    t = time.perf_counter()
    now = datetime.now(UTC).replace(tzinfo=None)
    parts = 0
    for (sid, attempt), part in results.partition_by(["shard_id", "attempt"], as_dict=True).items():
        write_results(store, JOB, sid, int(attempt), 1, full_results(part, sid, int(attempt), now))
        parts += 1
    return {"items_write_s": items_s, "results_write_s": time.perf_counter() - t, "result_parts": parts}


def _best(label: str, fn, reps: int = 3) -> float:
    secs, _ = repeat(fn, reps)
    print(f"      {min(secs):7.3f} s  {label}")
    return min(secs)


def breakdown_in_memory(items: pl.DataFrame, res: pl.DataFrame, states: pl.DataFrame) -> dict:
    """The steps inside item_states and check_invariant, and the plain formulations they replaced."""
    from batch_pipeline.core.ledger.reconcile import _item_states_by_id

    print("    breakdown ('was' = the plain formulation, kept in core as the fallback on a hash collision):")
    out = {}
    out["item_states (core: 64-bit hash key, numeric sort + sorted group_by, one join)"] = _best(
        "item_states (core: 64-bit hash key, numeric sort + sorted group_by, one join)",
        lambda: item_states(items, res, BUDGET),
    )
    out["was: item_states on the ID strings"] = _best(
        "was: sort(attempt) + group_by(request_id) with 6 aggregates + join on the ID strings",
        lambda: _item_states_by_id(items, res, BUDGET),
    )
    out["check: items hash n_unique"] = _best(
        "check_invariant: n_unique of the items' ID hashes", lambda: items.get_column("request_id").hash().n_unique()
    )
    out["was: items n_unique strings"] = _best(
        "was: n_unique of the ID strings", lambda: items.get_column("request_id").n_unique()
    )
    out["check: anti join"] = _best(
        "check_invariant: results anti join items on the ID strings (no unique() first)",
        lambda: res.select("request_id").join(items.select("request_id"), on="request_id", how="anti"),
    )
    out["was: unique + anti join"] = _best(
        "was: results.select(request_id).unique() then the anti join",
        lambda: res.select("request_id").unique().join(items.select("request_id"), on="request_id", how="anti"),
    )
    out["check: succeeded hash n_unique"] = _best(
        "check_invariant: distinct hashes of succeeded IDs",
        lambda: res.filter(pl.col("status") == "succeeded").get_column("request_id").hash().n_unique(),
    )
    out["was: succeeded unique"] = _best(
        "was: results.filter(succeeded).select(request_id).unique()",
        lambda: res.filter(pl.col("status") == "succeeded").select("request_id").unique(),
    )
    out["check: counts_by_shard"] = _best("check_invariant: counts_by_shard(states)", lambda: counts_by_shard(states))
    return out


def breakdown_read(store: Store) -> dict:
    print("    read_results breakdown ('was' = the previous formulation):")
    paths = JobPaths(JOB)
    files = store.list_files(paths.results, recursive=True, suffix=".parquet")
    local = [str(store.local_path(r)) for r in files]
    out = {}
    out["scan_parquet"] = _best(
        f"core: pl.scan_parquet({len(files)} parts).select(cols).collect() (parallel)",
        lambda: pl.scan_parquet(local).select(STATE_COLUMNS).collect(),
    )
    out["was: read_part x parts"] = _best(
        f"was: read_part() of {len(files)} parts, one after another",
        lambda: [store.read_part(r, STATE_COLUMNS) for r in files],
    )
    frame = pl.scan_parquet(local).select(STATE_COLUMNS).collect()
    out["duplicate check"] = _best(
        "core: duplicate check on (hash(request_id), attempt) (unique() only if any)",
        lambda: frame.select(pl.struct(pl.col("request_id").hash(), "attempt").is_duplicated().any()).item(),
    )
    out["was: unique(maintain_order)"] = _best(
        "was: unique(subset=[request_id, attempt], keep='first', maintain_order=True) always",
        lambda: frame.unique(subset=["request_id", "attempt"], keep="first", maintain_order=True),
    )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=1_000_000)
    ap.add_argument("--shards", type=int, default=200)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--keep", action="store_true", help="keep the temp store (path printed)")
    ap.add_argument(
        "--breakdown",
        action="store_true",
        help="also time the steps inside item_states, check_invariant and read_results",
    )
    args = ap.parse_args(argv)
    out: dict = {"items": args.items, "shards": args.shards, "date": date.today().isoformat()}

    t = time.perf_counter()
    items, results = make_data(args.items, args.shards, args.seed)
    print(
        f"reconcile: {items.height:,} items over {args.shards} shards, {results.height:,} result rows "
        f"(generated in {time.perf_counter() - t:.1f}s)",
        flush=True,
    )
    out["result_rows"] = results.height
    state_results = results.select(STATE_COLUMNS)

    # 1. in memory
    def reconcile(items_f: pl.DataFrame, results_f: pl.DataFrame):
        states = item_states(items_f, results_f, BUDGET)
        per_shard = counts_by_shard(states)
        total = check_invariant(items_f, results_f, states)
        return states, per_shard, total

    sections = {}
    for name, fn in (("item_states", lambda: item_states(items, state_results, BUDGET)),):
        secs, states = repeat(fn, args.repeat)
        sections[name] = min(secs)
    secs, _ = repeat(lambda: counts_by_shard(states), args.repeat)
    sections["counts_by_shard"] = min(secs)
    secs, total = repeat(lambda: check_invariant(items, state_results, states), args.repeat)
    sections["check_invariant"] = min(secs)
    secs, (states, per_shard, total) = repeat(lambda: reconcile(items, state_results), args.repeat)
    out["in_memory_s"] = min(secs)
    out["in_memory_sections_s"] = sections
    print(
        f"  item_states + counts_by_shard + check_invariant: {summary(secs)}  ({items.height / min(secs):,.0f} items/s)"
    )
    print("    " + ", ".join(f"{k} {v:.3f} s" for k, v in sections.items()))
    print(f"    job counts: {total.as_dict()}")
    assert total.balanced and total.expected == items.height
    by_state = states.group_by("state").len().sort("state")
    print("    states: " + ", ".join(f"{s} {n:,}" for s, n in by_state.iter_rows()))
    out["states"] = dict(by_state.iter_rows())
    out["job_counts"] = total.as_dict()
    out["rss_after_in_memory_mb"] = maxrss_mb()
    if args.breakdown:
        out["breakdown_in_memory"] = breakdown_in_memory(items, state_results, states)

    # 2. from the store
    tmp = tempfile.mkdtemp(prefix="reconcile_bench-")
    try:
        store = Store(tmp)
        w = write_store(store, items, results)
        out.update(w)
        print(
            f"  wrote {args.shards} item shards ({w['items_write_s']:.1f}s) and {w['result_parts']} result parts "
            f"with write_results ({w['results_write_s']:.1f}s)",
            flush=True,
        )
        reps = max(1, args.repeat // 2 + 1)
        out["rss_after_write_mb"] = maxrss_mb()
        secs, rs = repeat(lambda: read_results(store, JOB, columns=STATE_COLUMNS), reps)
        out["read_results_state_cols_s"] = min(secs)
        out["rss_after_read_state_cols_mb"] = maxrss_mb()
        print(
            f"  read_results(columns=STATE_COLUMNS): {summary(secs)}  ({rs.height:,} rows, "
            f"{rs.height / min(secs):,.0f} rows/s)"
        )
        assert rs.height == results.height
        secs, rf = repeat(lambda: read_results(store, JOB), reps)
        out["read_results_all_cols_s"] = min(secs)
        print(
            f"  read_results(all columns):           {summary(secs)}  ({rf.height:,} rows, "
            f"{rf.height / min(secs):,.0f} rows/s)"
        )
        del rf
        out["rss_after_read_all_cols_mb"] = maxrss_mb()
        if args.breakdown:
            out["breakdown_read_results"] = breakdown_read(store)
        secs, _ = repeat(lambda: read_results(store, JOB, shard_name(1), STATE_COLUMNS), 5)
        out["read_results_one_shard_s"] = min(secs)
        print(f"  read_results(one shard, state cols): {summary(secs)}")
        manifest = Manifest(JOB, store)
        secs, idx = repeat(lambda: manifest.item_index(["request_id", "shard_id"]), reps)
        out["item_index_s"] = min(secs)
        print(f"  Manifest.item_index(request_id, shard_id): {summary(secs)}")

        def from_store():
            items_f = pl.from_arrow(manifest.item_index(["request_id", "shard_id"]))
            res = read_results(store, JOB, columns=STATE_COLUMNS)
            return reconcile(items_f, res)

        secs, (_, _, total2) = repeat(from_store, reps)
        out["from_store_total_s"] = min(secs)
        assert total2.as_dict() == total.as_dict(), (total2, total)
        print(
            f"  whole reconcile from the store (item_index + read_results + states + counts + invariant): "
            f"{summary(secs)}"
        )
        if args.keep:
            print(f"  store kept at {tmp}")
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    out["peak_rss_mb"] = maxrss_mb()
    print(
        "  peak RSS (MB) after: in-memory part {rss_after_in_memory_mb:,.0f}, "
        "writing the store {rss_after_write_mb:,.0f}, "
        "read_results(state cols) {rss_after_read_state_cols_mb:,.0f}, read_results(all cols) "
        "{rss_after_read_all_cols_mb:,.0f}".format(**out)
    )
    met = out["in_memory_s"] < 1.0
    out["target_in_memory_lt_1s"] = met
    print(
        f"  [{'ok' if met else 'MISS'}] in-memory reconcile < 1 s ({out['in_memory_s']:.3f} s); "
        f"peak RSS {out['peak_rss_mb']:,.0f} MB"
    )
    OUT.mkdir(exist_ok=True)
    (OUT / f"reconcile_bench-{args.items}.json").write_text(json.dumps(out, indent=1, default=str))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
