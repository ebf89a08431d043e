"""Manifest build throughput: our streaming ``build_manifest`` against a plain-Python reference.

One script run times both variants on the same cached input (``make_rows.py``, generated once by a separate
process and cached under the gitignored ``benchmarks/out/``), each in its own ``spawn`` subprocess; peak RSS
is the child's own ``VmHWM`` from ``/proc`` (``ru_maxrss`` would carry the parent's high-water mark):

- reference: per row ``json.loads``, ``ids.normalize_text``, sha256 over prefix + text, a Python set
  for dedup, one JSON-lines file per shard of 5,000 unique requests (request_id, key, line, prompt);
- ours: ``batch_pipeline.core.manifest.shards.build_manifest`` on a job spec (text_field body, key_field id,
  template "{body}", shards of 5,000) with a local ``Store`` in a temp dir.

Both must find the same number of unique requests and the same set of request IDs (compared by a
digest of the sorted IDs, computed after the timed section). Targets: ours >= 3x the reference,
peak RSS < 1.5 GB at 2M rows. Wall and CPU seconds are measured in the child around the work only; with
``--repeat N`` the variants alternate N times and the fastest run is reported (the machine may be shared).
``--sections`` times the phases of ``build()`` (wall and the calling thread's CPU seconds).

    python benchmarks/manifest_bench.py --rows 1000000 [--rows 2000000] [--repeat 2] [--sections] [--profile]
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from benchmarks._harness import OUT, cpu_s, load, maxrss_mb, run_in_child  # noqa: E402

SHARD_SIZE = 5000
JOB = "manifest_bench"
SPEC_YAML = """\
name: {job}
input:
  path: {path}
  format: jsonl
  text_field: body
  key_field: id
  max_input_tokens: 1000000
prompt:
  version: v1
  template: "{{body}}"
model: gpt-4o-mini
backend:
  name: openai_batch
sampling: {{temperature: 0, max_tokens: 16}}
output:
  choice: [billing, bug, feature_request, account, other]
shards: {{max_requests: {shard}}}
"""


def _sorted_digest(chunks) -> str:
    """The first 16 hex digits of sha256 over sorted IDs, each followed by a newline (``chunks``: lists of them)."""
    import hashlib

    h = hashlib.sha256()
    for chunk in chunks:
        h.update("\n".join(chunk).encode())
        h.update(b"\n")
    return h.hexdigest()[:16]


def _digest(ids: list[str]) -> str:
    ids.sort()
    return _sorted_digest(ids[i : i + 100_000] for i in range(0, len(ids), 100_000))


def _column_digest(column) -> str:
    """``_digest`` of an Arrow string column, sorted by Arrow and read 100k IDs at a time: the same digest (hex IDs
    sort alike as bytes and as code points) without 95M Python strings at 100M rows (~21 GB)."""
    import pyarrow.compute as pc

    ordered = pc.take(column, pc.sort_indices(column))
    return _sorted_digest(ordered.slice(i, 100_000).to_pylist() for i in range(0, len(ordered), 100_000))


# -- variants (run in spawned children) ---------------------------------------------------------
def reference(path: str, out_dir: str, prefix: bytes) -> dict:
    import hashlib
    import json as _json

    from batch_pipeline.core.manifest.ids import normalize_text  # imports only hashlib and re

    rss_before = maxrss_mb()
    cpu0 = cpu_s()
    started = time.perf_counter()
    base = hashlib.sha256(prefix)
    seen: set[str] = set()
    buf: list[str] = []
    shards = rows = rejected = 0
    dumps, loads = _json.dumps, _json.loads

    def flush() -> None:
        nonlocal shards
        shards += 1
        with open(os.path.join(out_dir, f"s{shards:05d}.jsonl"), "w", encoding="utf-8") as out:
            out.write("\n".join(buf))
            out.write("\n")
        buf.clear()

    with open(path, "rb") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            rows += 1
            row = loads(line)
            body = row.get("body")
            if not isinstance(body, str):
                rejected += 1
                continue
            text = normalize_text(body)
            if not text:
                rejected += 1
                continue
            h = base.copy()
            h.update(text.encode("utf-8"))
            rid = h.hexdigest()
            if rid in seen:
                continue
            seen.add(rid)
            buf.append(
                dumps(
                    {"request_id": rid, "key": row.get("id"), "line": lineno, "user_prompt": text}, ensure_ascii=False
                )
            )
            if len(buf) >= SHARD_SIZE:
                flush()
    if buf:
        flush()
    seconds = time.perf_counter() - started
    cpu = cpu_s() - cpu0
    rss = maxrss_mb()
    return {
        "variant": "reference",
        "seconds": seconds,
        "cpu_s": cpu,
        "rows": rows,
        "unique": len(seen),
        "shards": shards,
        "rejected": rejected,
        "peak_rss_mb": rss,
        "rss_after_imports_mb": rss_before,
        "digest": _digest(list(seen)),
    }


def _install_section_timers(totals: dict[str, float]) -> None:
    """Wrap the phases of ManifestBuilder.build with timers (cheap, unlike cProfile).

    Each section records wall seconds and the CPU seconds of the thread that ran it (``time.thread_time``;
    Polars and Arrow worker threads not included), keyed ``"wall|<label>"`` and ``"cpu|<label>"``. Steps on the
    background writer thread are labelled ``[writer]``: their wall time overlaps the main thread's.
    """
    from batch_pipeline.core import store
    from batch_pipeline.core.manifest import deal, ids, prepare
    from batch_pipeline.core.manifest import shards as manifest

    def add(label, wall, cpu):
        totals[f"wall|{label}"] = totals.get(f"wall|{label}", 0.0) + wall
        totals[f"cpu|{label}"] = totals.get(f"cpu|{label}", 0.0) + cpu

    def timed(owner, name, label=None):
        fn = getattr(owner, name)
        label = label or name

        def wrapper(*a, **kw):
            t, c = time.perf_counter(), time.thread_time()
            try:
                return fn(*a, **kw)
            finally:
                add(label, time.perf_counter() - t, time.thread_time() - c)

        setattr(owner, name, wrapper)

    def timed_gen(owner, name, label):
        fn = getattr(owner, name)

        def wrapper(*a, **kw):
            it = fn(*a, **kw)
            while True:
                t, c = time.perf_counter(), time.thread_time()
                try:
                    item = next(it)
                except StopIteration:
                    add(label, time.perf_counter() - t, time.thread_time() - c)
                    return
                add(label, time.perf_counter() - t, time.thread_time() - c)
                yield item

        setattr(owner, name, wrapper)

    timed(manifest, "_count_rows", "_count_rows (head of the input, to size the window)")
    timed_gen(prepare, "read_batches", "[reader] read_batches (Arrow JSON + _jsonl_block)")
    timed(prepare.FilePreparer, "_prepare", "[reader] _prepare (Polars normalise/render/estimate)")
    timed(ids, "request_ids", "ids.request_ids (hashlib loop)")
    timed(deal.Dealer, "_write_shard", "[writer] _write_shard (concat+sort+zstd Parquet)")
    timed(deal.Dealer, "deal", "Dealer.deal (stratified order, round-robin, partition_by)")
    timed(manifest.Dedup, "offer", "Dedup.offer (sets, or the spill buffer)")
    timed(manifest.IdIndex, "ensure", "IdIndex.ensure (index files of earlier generations)")
    timed(manifest.Dedup, "finish", "Dedup.finish (hash ranges against the index, when spilled)")
    timed(
        store.BackgroundWrites,
        "submit",
        "BackgroundWrites.submit (rows and shards to the writers; waits while they are behind)",
    )
    timed(store.BackgroundWrites, "close", "BackgroundWrites.close (drain at the end)")
    from contextlib import contextmanager

    original = store.Store.parquet_writer

    class _TimedWriter:
        def __init__(self, inner):
            self._inner = inner

        def write_table(self, *a, **kw):
            t, c = time.perf_counter(), time.thread_time()
            try:
                return self._inner.write_table(*a, **kw)
            finally:
                add(
                    "[writer] rows table: ParquetWriter.write_table (zstd)",
                    time.perf_counter() - t,
                    time.thread_time() - c,
                )

        def __getattr__(self, name):
            return getattr(self._inner, name)

    @contextmanager
    def parquet_writer(self, rel, *a, **kw):
        # only the rows file's writer: since c8c4a57 every shard's ``write_table`` goes through here too, and was
        # counted twice (in ``_write_shard`` and as the rows table)
        with original(self, rel, *a, **kw) as w:
            yield _TimedWriter(w) if "/manifest/rows/" in rel else w

    store.Store.parquet_writer = parquet_writer


CODECS = {  # the shard files' and the rows file's Parquet codec (issue 19's shard-file decision)
    "zstd1": {"compression": "zstd", "compression_level": 1},
    "zstd3": {"compression": "zstd", "compression_level": 3},
    "lz4": {"compression": "lz4"},
    "snappy": {"compression": "snappy"},
    "none": {"compression": "none"},
}


def use_codec(codec: str) -> None:
    """Write the manifest's shard files and rows file with ``codec`` (the default is what the code ships)."""
    from batch_pipeline.core.manifest import deal, shards

    for table in (deal.SHARD_PARQUET, shards.ROWS_PARQUET):
        table.pop("compression_level", None)
        table.update(CODECS[codec])


def ours(
    path: str, work: str, sections: bool, profile: bool, dedup_budget_mb: int | None = None, codec: str = "zstd1"
) -> dict:
    from batch_pipeline.core.manifest.shards import Manifest, build_manifest

    use_codec(codec)
    from batch_pipeline.core.spec.loading import load_spec
    from batch_pipeline.core.store import Store

    spec_path = Path(work) / "job.yaml"
    spec = load_spec(spec_path)
    store = Store(Path(work) / "store")
    totals: dict[str, float] = {}
    if sections:
        _install_section_timers(totals)
    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile()
    rss_before = maxrss_mb()
    cpu0 = cpu_s()
    started = time.perf_counter()
    if prof:
        prof.enable()
    summary = build_manifest(
        spec, store, dedup_budget_bytes=None if dedup_budget_mb is None else dedup_budget_mb * 2**20
    )
    if prof:
        prof.disable()
    seconds = time.perf_counter() - started
    cpu = cpu_s() - cpu0
    rss = maxrss_mb()
    index = Manifest(spec.name, store).item_index(["request_id", "shard_id"])
    import pyarrow.compute as pc

    largest = pc.max(pc.value_counts(index.column("shard_id")).field("counts")).as_py() if index.num_rows else 0
    out = {
        "variant": "ours",
        "cpu_s": cpu,
        "largest_shard": largest,
        "seconds": seconds,
        "rows": summary.input_rows,
        "unique": summary.unique_requests,
        "shards": summary.shards_total,
        "rejected": summary.rejected_rows,
        "peak_rss_mb": rss,
        "rss_after_imports_mb": rss_before,
        "digest": _column_digest(index.column("request_id")),
        "items_in_shards": index.num_rows,
        "duplicates_collapsed": summary.duplicates_collapsed,
        "spilled": summary.spilled,
        "codec": codec,
        "store_bytes": sum(f.stat().st_size for f in (Path(work) / "store").rglob("*") if f.is_file()),
    }
    if sections:
        out["sections"] = totals
    if prof:
        import io
        import pstats

        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
        out["profile"] = s.getvalue()
    return out


# -- driver ---------------------------------------------------------------------------------------
def bench(
    rows: int,
    seed: int,
    sections: bool,
    profile: bool,
    variants: list[str],
    repeat: int = 1,
    short: bool = False,
    dedup_budget_mb: int | None = None,
    zstd: bool = False,
) -> dict:
    from batch_pipeline.core.manifest import ids
    from batch_pipeline.core.spec.loading import load_spec
    from benchmarks.make_rows import rows_file

    path, meta = rows_file(rows, seed, short=short, zstd=zstd)  # generated (once) by a separate process
    with open(path, "rb") as f:  # warm the page cache so neither variant pays the first read
        while f.read(64 * 2**20):
            pass
    work = tempfile.mkdtemp(prefix="manifest_bench-")
    try:
        spec_path = Path(work) / "job.yaml"
        spec_path.write_text(SPEC_YAML.format(job=JOB, path=path, shard=SHARD_SIZE))
        spec = load_spec(spec_path)
        prefix = ids.id_prefix(spec.prompt.version, spec.model, spec.settings_fingerprint())
        results: dict[str, dict] = {}
        runs: dict[str, list[dict]] = {v: [] for v in variants}
        for _ in range(repeat):
            for v in variants:
                if v == "reference":
                    ref_dir = Path(work) / "reference"
                    shutil.rmtree(ref_dir, ignore_errors=True)
                    ref_dir.mkdir()
                    r = run_in_child("benchmarks.manifest_bench:reference", str(path), str(ref_dir), prefix)
                else:
                    shutil.rmtree(Path(work) / "store", ignore_errors=True)
                    codec = v.split(":", 1)[1] if ":" in v else "zstd1"  # "ours" ships zstd 1
                    r = run_in_child(
                        "benchmarks.manifest_bench:ours", str(path), work, sections, profile, dedup_budget_mb, codec
                    )
                r["load_after"] = load()
                runs[v].append(r)
                print(
                    f"  {v:11s} {rows:>9,} rows  {r['seconds']:6.1f} s (cpu {r['cpu_s']:5.1f} s)  "
                    f"{rows / r['seconds']:>7,.0f} rows/s  load {r['load_after']:.1f}  "
                    f"peak RSS {r['peak_rss_mb']:7,.0f} MB (after imports {r['rss_after_imports_mb']:,.0f} MB)  "
                    f"unique {r['unique']:,}"
                    + (f"  spilled {r['spilled']}" if "spilled" in r else "")
                    + (f"  store {r['store_bytes'] / 2**20:,.0f} MiB" if "store_bytes" in r else ""),
                    flush=True,
                )
        for v, rs in runs.items():  # report the fastest run; keep every time and the largest peak RSS
            results[v] = dict(min(rs, key=lambda x: x["seconds"]))
            results[v]["all_seconds"] = [round(x["seconds"], 2) for x in rs]
            results[v]["peak_rss_mb"] = max(x["peak_rss_mb"] for x in rs)
        if repeat > 1:
            for v, r in results.items():
                print(
                    f"  best of {repeat}: {v:9s} {r['seconds']:6.1f} s  {rows / r['seconds']:>7,.0f} rows/s  "
                    f"(all: {r['all_seconds']})  max peak RSS {r['peak_rss_mb']:,.0f} MB"
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = {
        "rows": rows,
        "seed": seed,
        "input_bytes": meta["bytes"],
        "expected_unique": meta["unique"],
        "date": date.today().isoformat(),
        "cpus": os.cpu_count(),
        "load_at_end": load(),
        **{k: v for k, v in results.items()},
    }
    for r in results.values():
        r["rows_per_s"] = rows / r["seconds"]
    checks = []
    for v, r in results.items():
        checks.append((f"{v}: unique == expected ({meta['unique']:,})", r["unique"] == meta["unique"]))
    if {"reference", "ours"} <= results.keys():
        ref, our = results["reference"], results["ours"]
        out["ratio"] = ref["seconds"] / our["seconds"]
        checks.append(("same unique count", ref["unique"] == our["unique"]))
        checks.append(("same request-ID set (digest)", ref["digest"] == our["digest"]))
        checks.append(("ours >= 3x reference", out["ratio"] >= 3.0))
        print(f"  ratio ours/reference: {out['ratio']:.2f}x")
    if "ours" in results:
        ours_r = results["ours"]
        checks.append(("ours: items in shards == unique", ours_r["items_in_shards"] == ours_r["unique"]))
        checks.append((f"ours: no shard above {SHARD_SIZE}", results["ours"]["largest_shard"] <= SHARD_SIZE))
        checks.append(
            (
                "ours: duplicates_collapsed == accepted - unique",
                ours_r["duplicates_collapsed"] == ours_r["rows"] - ours_r["rejected"] - ours_r["unique"],
            )
        )
        if rows == 2_000_000:
            checks.append(("ours peak RSS < 1.5 GB", results["ours"]["peak_rss_mb"] < 1536))
        checks.append(
            (
                "ours peak RSS < 4 GB (a 4 GB pod, shards.manifest_memory_mb default)",
                results["ours"]["peak_rss_mb"] < 4096,
            )
        )
    for v, r in results.items():  # every codec writes the same items
        if v.startswith("ours:") and "ours" in results:
            checks.append((f"{v}: same request-ID set as ours", r["digest"] == results["ours"]["digest"]))
    out["checks"] = {name: ok for name, ok in checks}
    for name, ok in checks:
        print(f"  [{'ok' if ok else 'MISS'}] {name}")
    if sections and "ours" in results:
        r = results["ours"]
        sec = r["sections"]
        labels = sorted({k.split("|", 1)[1] for k in sec}, key=lambda k: -sec[f"wall|{k}"])
        total = r["seconds"]
        print(
            f"  ours, time by section (of {total:.1f} s wall, {r['cpu_s']:.1f} s CPU in all threads; "
            "thread CPU = the calling thread's own):"
        )
        print(f"    {'wall s':>7} {'share':>6} {'thread CPU s':>12}  section")
        main_wall = 0.0
        for name in labels:
            w, c = sec[f"wall|{name}"], sec[f"cpu|{name}"]
            if not name.startswith("["):
                main_wall += w
            print(f"    {w:7.2f} {100 * w / total:5.1f}% {c:12.2f}  {name}")
        rest = total - main_wall
        print(
            f"    {rest:7.2f} {100 * rest / total:5.1f}% {'':>12}  rest of build() on the main thread: dedup/dealing "
            "loop, to_list(), Series, partition_by"
        )
    if profile and "ours" in results:
        print(results["ours"]["profile"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, action="append", help="repeatable; default 1000000")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--only", choices=["reference", "ours"], help="run one variant")
    ap.add_argument("--sections", action="store_true", help="time the phases of build_manifest")
    ap.add_argument("--repeat", type=int, default=1, help="runs per variant (alternating); the fastest is reported")
    ap.add_argument(
        "--dedup-budget-mb",
        type=int,
        default=None,
        help="ours: the dedup's memory before it spills (default: half of shards.manifest_memory_mb); "
        "0 spills from the start, a large value keeps every ID in memory",
    )
    ap.add_argument("--short", action="store_true", help="~300-character rows (make_rows --short), e.g. for 100M")
    ap.add_argument("--zstd", action="store_true", help="the input compressed whole (make_rows --zstd: .jsonl.zst)")
    ap.add_argument("--profile", action="store_true", help="cProfile build_manifest (slows Python code)")
    ap.add_argument(
        "--codec",
        action="append",
        choices=sorted(CODECS),
        default=[],
        help="also run ours with this shard-file codec (repeatable; variant ours:CODEC; ours ships zstd1)",
    )
    args = ap.parse_args(argv)
    if args.zstd and args.only != "ours":
        ap.error("--zstd reads the compressed input with ours only: add --only ours")
    variants = [args.only] if args.only else ["reference", "ours"]
    variants += [f"ours:{c}" for c in args.codec]
    all_out = []
    for rows in args.rows or [1_000_000]:
        print(f"manifest build, {rows:,} rows (seed {args.seed}):", flush=True)
        out = bench(
            rows,
            args.seed,
            args.sections,
            args.profile,
            variants,
            args.repeat,
            args.short,
            args.dedup_budget_mb,
            args.zstd,
        )
        all_out.append(out)
        OUT.mkdir(exist_ok=True)
        tag = (
            (f"-{args.only}" if args.only else "")
            + ("-short" if args.short else "")
            + ("-zstd" if args.zstd else "")
            + (f"-dedup{args.dedup_budget_mb}" if args.dedup_budget_mb is not None else "")
            + "".join(f"-{c}" for c in args.codec)
        )
        (OUT / f"manifest_bench-{rows}{tag}.json").write_text(
            json.dumps({k: v for k, v in out.items()}, indent=1, default=str)
        )
    return 0 if all(all(o["checks"].values()) for o in all_out) else 1


if __name__ == "__main__":
    sys.exit(main())
