"""Micro-benchmarks behind the manifest hot spots: the current core step against candidate changes.

Runs on the first ``--rows`` rows of the cached ``make_rows`` file, block by block (8 MB, as
``jsonl.read_jsonl`` cuts them), and prints seconds per million rows for each step, so the gains can be
compared with the ``manifest_bench.py --sections`` breakdown.

    python benchmarks/manifest_hotspots.py [--rows 200000]
    python benchmarks/manifest_hotspots.py --dedup 5000000 [--probes 1000000]   # the dedup structures
"""

import argparse
import hashlib
import io
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

import polars as pl  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.json as pajson  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from batch_pipeline.core.manifest import ids  # noqa: E402
from batch_pipeline.core.manifest.jsonl import _jsonl_block
from batch_pipeline.core.manifest.rows import CHUNK_BYTES
from batch_pipeline.core.manifest.shards import ITEM_SCHEMA, normalise_fields  # noqa: E402
from benchmarks.make_rows import ensure_rows  # noqa: E402

PREFIX = ids.id_prefix("v1", "gpt-4o-mini", "0123456789abcdef")


def blocks_of(path: Path, rows: int) -> list[bytes]:
    out, n, carry = [], 0, b""
    with open(path, "rb") as f:
        while n < rows:
            chunk = f.read(CHUNK_BYTES)
            if not chunk:
                break
            data = carry + chunk
            cut = data.rfind(b"\n")
            block, carry = data[: cut + 1], data[cut + 1 :]
            out.append(block)
            n += block.count(b"\n")
    return out


def timeit(label: str, fn, rows: int, results: dict, reps: int = 3):
    best = float("inf")
    value = None
    for _ in range(reps):
        t = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - t)
    per_m = best / rows * 1e6
    results[label] = per_m
    print(f"  {per_m:7.2f} s per 1M rows  {label}", flush=True)
    return value


def _rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def dedup_alternatives(n: int, probes: int) -> None:
    """The dedup structures considered for ``core/manifest/dedup.py``, on ``n`` random 64-hex IDs: memory per
    ID (RSS growth while building) and the time to build them and to answer ``probes`` lookups (half hits)."""
    import gc
    import os
    import tempfile

    import numpy as np

    rng = np.random.default_rng(5)
    raw = rng.integers(0, 2**63, size=(n, 4), dtype=np.int64)
    hex_ids = [bytes(r).hex() for r in raw.view(np.uint8).reshape(n, 32)]
    probe = hex_ids[: probes // 2] + [
        bytes(r).hex()
        for r in rng.integers(0, 2**63, size=(probes - probes // 2, 4), dtype=np.int64).view(np.uint8).reshape(-1, 32)
    ]
    print(f"dedup structures, {n:,} IDs, {len(probe):,} probes (half hits):")

    def measure(label, build, lookup):
        gc.collect()
        before = _rss_mb()
        t = time.perf_counter()
        obj = build()
        built = time.perf_counter() - t
        grown = _rss_mb() - before
        t = time.perf_counter()
        hits = lookup(obj)
        looked = time.perf_counter() - t
        print(f"  {grown / n * 2**20:6.0f} B/ID  build {built:6.2f} s  probes {looked:6.2f} s  hits {hits:,}  {label}")
        del obj
        gc.collect()

    # the in-memory path makes each ID string as it hashes: build from new strings, so their memory counts
    measure(
        "Python set of 64-char str (the in-memory path)",
        lambda: {(h + " ")[:-1] for h in hex_ids},
        lambda s: sum(1 for p in probe if p in s),
    )
    measure(
        "Python set of 32-byte digests",
        lambda: {bytes.fromhex(h) for h in hex_ids},
        lambda s: sum(1 for p in probe if bytes.fromhex(p) in s),
    )
    measure(
        "Polars String column + anti/semi join per block of 10k probes",
        lambda: pl.DataFrame({"request_id": hex_ids}),
        lambda f: sum(
            f.join(pl.DataFrame({"request_id": probe[i : i + 10_000]}), on="request_id", how="semi").height
            for i in range(0, len(probe), 10_000)
        ),
    )
    measure(
        "Polars join, all probes at once (the per-range spill decision)",
        lambda: pl.DataFrame({"request_id": hex_ids}),
        lambda f: f.join(pl.DataFrame({"request_id": probe}), on="request_id", how="semi").height,
    )
    import duckdb

    def duck_build():
        con = duckdb.connect()
        frame = pl.DataFrame({"request_id": hex_ids})  # noqa: F841 - read by DuckDB's replacement scan
        con.execute("CREATE TABLE idx AS SELECT request_id FROM frame")
        return con

    def duck_probe(con):
        frame = pl.DataFrame({"request_id": probe})  # noqa: F841
        return con.execute("SELECT count(*) FROM frame SEMI JOIN idx USING (request_id)").fetchone()[0]

    measure("DuckDB table in memory + semi join, all probes at once", duck_build, duck_probe)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "idx.parquet")
        pl.DataFrame({"request_id": sorted(hex_ids)}).write_parquet(path, row_group_size=65_536)
        size = os.path.getsize(path)

        by_range = pl.DataFrame({"request_id": probe}).with_columns(pl.col("request_id").str.slice(0, 2).alias("p"))
        by_range = {k[0]: v for k, v in by_range.partition_by("p", as_dict=True).items()}

        def from_disk(_):
            from batch_pipeline.core.manifest.index import _Cursor, hex_range
            from batch_pipeline.core.store import Store

            cursor = _Cursor(Store(tmp), "idx.parquet")
            hits = 0
            for i in range(256):
                p = format(i, "02x")
                part = pl.DataFrame({"request_id": cursor.take(*hex_range(p))}, schema={"request_id": pl.String})
                hits += part.join(by_range[p], on="request_id", how="semi").height
            return hits

        measure(
            f"sorted Parquet index on disk ({size / n:.0f} B/ID on disk), 256 ranges read in order (IdIndex)",
            lambda: None,
            from_disk,
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dedup", type=int, default=0, help="only measure the dedup structures on this many IDs")
    ap.add_argument("--probes", type=int, default=1_000_000)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--source-rows", type=int, default=1_000_000, help="which cached make_rows file to read")
    args = ap.parse_args(argv)
    if args.dedup:
        dedup_alternatives(args.dedup, args.probes)
        return 0
    path, _ = ensure_rows(args.source_rows, args.seed)
    blocks = blocks_of(path, args.rows)
    n = sum(b.count(b"\n") for b in blocks)
    mb = sum(len(b) for b in blocks) / 2**20
    print(
        f"{n:,} rows in {len(blocks)} blocks of ~8 MB ({mb:,.0f} MiB), pyarrow {pa.__version__}, "
        f"polars {pl.__version__}"
    )
    r: dict[str, float] = {}
    fields = ["body"]
    schema = pa.schema([("body", pa.string()), ("id", pa.string())])
    options = pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")

    print("read (jsonl._jsonl_block):")
    frames = timeit(
        "core _jsonl_block (no blank lines: Arrow read_json on the block as is, from_arrow)",
        lambda: [_jsonl_block("f", b, 1, fields, "id", options).frame for b in blocks],
        n,
        r,
    )
    timeit(
        "  of which pajson.read_json alone",
        lambda: [pajson.read_json(io.BytesIO(b), parse_options=options) for b in blocks],
        n,
        r,
    )
    timeit(
        "was: split/strip/join of lines in Python before the parse",
        lambda: [b"\n".join([ln for ln in b.split(b"\n") if ln.strip()]) for b in blocks],
        n,
        r,
    )
    timeit(
        "alt: pl.read_ndjson(block, schema)",
        lambda: [pl.read_ndjson(io.BytesIO(b), schema={"id": pl.String, "body": pl.String}) for b in blocks],
        n,
        r,
    )
    timeit(
        "alt: pajson.read_json, block_size 8 MB (one parse task per block)",
        lambda: [
            pajson.read_json(
                io.BytesIO(b), parse_options=options, read_options=pajson.ReadOptions(block_size=len(b) + 1)
            )
            for b in blocks
        ],
        n,
        r,
    )

    print("normalise (_prepare):")
    norm = [pl.col("body").str.replace_all(ids.ABNORMAL_WHITESPACE, " ").str.strip_chars(ids.WHITESPACE_CHARS)]
    normed = timeit(
        "core: manifest.normalise_fields (literal searches flag rows, regex on those, strip)",
        lambda: [normalise_fields(f, ["body"]) for f in frames],
        n,
        r,
    )
    was = timeit(
        "was: str.replace_all(ABNORMAL_WHITESPACE) + strip_chars on every row",
        lambda: [f.with_columns(norm) for f in frames],
        n,
        r,
    )
    assert all(a.equals(b) for a, b in zip(normed, was))
    timeit(
        "  of which str.contains(ABNORMAL_WHITESPACE) (the scan alone)",
        lambda: [f.select(pl.col("body").str.contains(ids.ABNORMAL_WHITESPACE).sum()) for f in frames],
        n,
        r,
    )
    ascii_ws = "[\\t\\n\\x0b\\x0c\\r ]"
    timeit(
        "  scan with an ASCII-only class, for comparison (not equivalent)",
        lambda: [
            f.select(pl.col("body").str.contains(f"{ascii_ws}{{2,}}|[\\t\\n\\x0b\\x0c\\r]").sum()) for f in frames
        ],
        n,
        r,
    )

    print("request IDs:")
    prompts = [f["body"] for f in normed]
    lists = timeit("was: Series.to_list() (Arrow -> Python str)", lambda: [s.to_list() for s in prompts], n, r)
    timeit(
        "was: ids.request_ids(prefix, list[str]) (encode + sha256 + hexdigest)",
        lambda: [ids.request_ids(PREFIX, x) for x in lists],
        n,
        r,
    )

    def bin_lists():
        return [s.cast(pl.Binary).to_list() for s in prompts]

    blists = timeit("core: .cast(pl.Binary).to_list() (bytes, no UTF-8 decode)", bin_lists, n, r)

    def hash_bytes(lst):
        base = hashlib.sha256(PREFIX)
        out = []
        append = out.append
        for b in lst:
            h = base.copy()
            h.update(b)
            append(h.hexdigest())
        return out

    timeit(
        "core: ids.request_ids(prefix, list[bytes]) (sha256 over the bytes, no encode)",
        lambda: [ids.request_ids(PREFIX, x) for x in blists],
        n,
        r,
    )
    timeit("same, inline replica", lambda: [hash_bytes(x) for x in blists], n, r)

    def hash_buffers():
        import numpy as np

        out_all = []
        base = hashlib.sha256(PREFIX)
        for s in prompts:
            arr = s.to_arrow()
            if isinstance(arr, pa.ChunkedArray):
                arr = arr.combine_chunks()
            arr = arr.cast(pa.large_string())
            _, offs, data = arr.buffers()
            o = np.frombuffer(offs, dtype=np.int64)[arr.offset : arr.offset + len(arr) + 1].tolist()
            mv = memoryview(data)
            out = []
            append = out.append
            for i in range(len(arr)):
                h = base.copy()
                h.update(mv[o[i] : o[i + 1]])
                append(h.hexdigest())
            out_all.append(out)
        return out_all

    timeit(
        "alt: sha256 over memoryview slices of the Arrow buffer (no per-row objects but the hex)", hash_buffers, n, r
    )
    try:
        import duckdb

        con = duckdb.connect()
        con.execute("SET threads = 2")
        pre = PREFIX.decode()

        def duck():
            out = []
            for s in prompts:
                con.register("prompts_t", pa.table({"p": s.to_arrow()}))
                out.append(con.execute("SELECT sha256(? || p) AS rid FROM prompts_t", [pre]).to_arrow_table())
            return out

        dres = timeit("alt: DuckDB sha256(prefix || prompt) over the Arrow column (2 threads)", duck, n, r)
        a = ids.request_ids(PREFIX, prompts[0].to_list()[:1000])
        same = dres[0].column("rid").to_pylist()[:1000] == a
        print(f"          DuckDB IDs identical to ids.request_ids: {same}")
    except Exception as exc:  # duckdb optional
        print(f"  (duckdb not usable: {exc})")

    print("dedup set (memory per key):")
    import tracemalloc

    sample = [x for lst in lists[:3] for x in ids.request_ids(PREFIX, lst)]
    tracemalloc.start()
    s1 = set(sample)
    m1 = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del s1
    digests = [bytes.fromhex(x) for x in sample]
    tracemalloc.start()
    s2 = set(digests)
    m2 = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del s2
    print(
        f"  set of 64-char hex str: {m1 / len(sample):.0f} B/key (+ the str objects, "
        f"{sys.getsizeof(sample[0])} B each); set of 32-byte digests: {m2 / len(sample):.0f} B/key "
        f"(+ {sys.getsizeof(digests[0])} B each)"
    )

    print("shard write (_close), per 5,000-row shard:")
    big = pl.concat([f.with_columns(pl.col("body").alias("user_prompt")) for f in normed])
    rid_col = pl.Series("request_id", [x for lst in lists for x in ids.request_ids(PREFIX, lst)])
    big = big.with_columns(
        rid_col,
        pl.lit(60, pl.Int32).alias("est_input_tokens"),
        pl.lit(3, pl.Int8).alias("length_bucket"),
        pl.col("user_prompt").str.len_bytes().cast(pl.Int32).alias("request_bytes"),
        pl.lit("input.jsonl").alias("source"),
        pl.int_range(pl.len()).alias("_line"),
    )
    shards = [big.slice(i, 5000) for i in range(0, big.height, 5000)]
    parts = [[s.slice(j, 1000) for j in range(0, s.height, 1000)] for s in shards]

    def to_tables():
        return [
            pl.concat(p)
            .sort("request_id")
            .select(
                "request_id",
                pl.lit("s00001").alias("shard_id"),
                "user_prompt",
                "est_input_tokens",
                "length_bucket",
                "request_bytes",
                "source",
                pl.col("_line").alias("line"),
                pl.lit(1).alias("generation"),
            )
            .to_arrow()
            .cast(ITEM_SCHEMA)
            for p in parts
        ]

    tables = timeit("core: concat + sort + select + to_arrow + cast", to_tables, n, r)

    def write(**kw):
        def go():
            for t in tables:
                buf = io.BytesIO()
                pq.write_table(t, buf, **kw)

        return go

    timeit("core: pq.write_table(zstd) (dictionary on every column, statistics on)", write(compression="zstd"), n, r)
    timeit(
        "alt: zstd, use_dictionary only for low-cardinality columns",
        write(compression="zstd", use_dictionary=["shard_id", "source", "length_bucket", "generation"]),
        n,
        r,
    )
    timeit(
        "alt: zstd, that + no statistics for user_prompt",
        write(
            compression="zstd",
            use_dictionary=["shard_id", "source", "length_bucket", "generation"],
            write_statistics=[
                "request_id",
                "shard_id",
                "est_input_tokens",
                "length_bucket",
                "request_bytes",
                "source",
                "line",
                "generation",
            ],
        ),
        n,
        r,
    )
    timeit(
        "alt: lz4, use_dictionary only for low-cardinality columns",
        write(compression="lz4", use_dictionary=["shard_id", "source", "length_bucket", "generation"]),
        n,
        r,
    )
    timeit("isolate: no compression, default dictionary", write(compression="none"), n, r)
    timeit("isolate: zstd, no dictionary at all", write(compression="zstd", use_dictionary=False), n, r)
    timeit("reference point: no compression, no dictionary", write(compression="none", use_dictionary=False), n, r)

    print("shard write in a background thread (GIL released while encoding), overlapped with hashing:")
    from concurrent.futures import ThreadPoolExecutor

    def serial():
        for t in tables:
            pq.write_table(t, io.BytesIO(), compression="zstd")
        for x in lists:
            ids.request_ids(PREFIX, x)

    def overlapped():
        with ThreadPoolExecutor(1) as pool:
            futs = [pool.submit(pq.write_table, t, io.BytesIO(), compression="zstd") for t in tables]
            for x in lists:
                ids.request_ids(PREFIX, x)
            for f in futs:
                f.result()

    timeit("serial: write every shard, then hash every row (as build() interleaves them)", serial, n, r)
    timeit("overlapped: shard writes on a 1-thread pool while the main thread hashes", overlapped, n, r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
