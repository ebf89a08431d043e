"""Results ingestion for Anthropic Message Batches: results JSONL -> validated result rows in the store.

Input (generated once, cached under ``benchmarks/out/``): the results file of a choice job in the format of
the provider wire formats (``PROVIDER_PROTOCOLS.md`` of the design notes) (and of the sandbox): a forced ``answer`` tool, so a succeeded line holds
one ``tool_use`` block with ``{"label": ...}``; ~97% good labels, 0.5% cut at ``max_tokens`` (empty input),
0.5% labels outside the set, 1% ``overloaded_error``, 0.5% ``invalid_request_error``, 0.5% ``expired``.

Variants, each in its own spawned process, timed in one run:
- reference: plain Python, ``json.loads`` per line, pick the ``RAW_RESULT_SCHEMA`` fields (tool input re-dumped),
  one zstd Parquet file. No validation, no cost.
- ours: what ``AnthropicBatchExecutor.fetch`` + ``ShardRunner._ingest`` run: 1 MiB reads -> ``iter_blocks``
  (16 MB) -> ``parse_results_block`` on the parse workers -> per block the payload part queued on one writer
  thread, ``build_results``, the result part on a second (landing after its payload).
- ours_runner: ``ShardRunner._ingest`` itself, one call per shard of ``--shard-lines`` (default 5,000), with a stub
  executor whose ``fetch`` is the Anthropic executor's (1 MiB chunks -> ``iter_blocks`` -> ``parse_results_block``
  on the parse workers).

Targets: ours >= 300k lines/s (issue 3: provider output JSONL -> store); ours_runner >= 300k (issue 10). Best and
median of ``--repeat`` (default 5) runs, variants interleaved, with the ratios to the reference's.

    python benchmarks/ingest_anthropic_bench.py [--lines 500000] [--repeat 5] [--shard-lines 5000]
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from benchmarks._harness import OUT, cpu_s, load, maxrss_mb, run_in_child  # noqa: E402
from benchmarks.ingest_bench import JOB, LABELS, _setup_ours  # noqa: E402

MIX = (
    ("ok", 0.97),
    ("truncated", 0.975),
    ("bad_label", 0.98),
    ("overloaded", 0.99),
    ("invalid", 0.995),
    ("expired", 1.0),
)


def generate(lines: int, seed: int) -> tuple[Path, dict]:
    import numpy as np

    path, meta_path = (
        OUT / f"anthropic-results-{lines}-seed{seed}.jsonl",
        OUT / f"anthropic-results-{lines}-seed{seed}.json",
    )
    if path.exists() and meta_path.exists():
        return path, json.loads(meta_path.read_text())
    rng = np.random.default_rng(seed)
    raw, kind = rng.bytes(64 * lines), rng.random(lines)
    label, prompt = rng.integers(0, len(LABELS), lines).tolist(), rng.integers(80, 420, lines).tolist()
    cached = np.where(rng.random(lines) < 0.3, 1024, 0).tolist()
    counts = dict.fromkeys((name for name, _ in MIX), 0)
    OUT.mkdir(exist_ok=True)
    out: list[str] = []
    for i in range(lines):
        h = raw[i * 64 : (i + 1) * 64].hex()
        name = next(n for n, upper in MIX if kind[i] < upper)
        counts[name] += 1
        if name in ("overloaded", "invalid"):
            typ, msg = (
                ("overloaded_error", "Overloaded")
                if name == "overloaded"
                else ("invalid_request_error", "prompt is too long: 210000 tokens > 200000 maximum")
            )
            result = {"type": "errored", "error": {"type": "error", "error": {"type": typ, "message": msg}}}
        elif name == "expired":
            result = {"type": "expired"}
        else:
            tool_input = {} if name == "truncated" else {"label": "spam" if name == "bad_label" else LABELS[label[i]]}
            result = {
                "type": "succeeded",
                "message": {
                    "id": f"msg_{h[64:88]}",
                    "type": "message",
                    "role": "assistant",
                    "model": "claude-haiku-4-5",
                    "content": [
                        {"type": "tool_use", "id": f"toolu_{h[88:112]}", "name": "answer", "input": tool_input}
                    ],
                    "stop_reason": "max_tokens" if name == "truncated" else "tool_use",
                    "stop_sequence": None,
                    "usage": {
                        "input_tokens": prompt[i],
                        "output_tokens": 3 if name == "truncated" else 12,
                        "cache_creation_input_tokens": 0,
                        "cache_read_input_tokens": cached[i],
                        "service_tier": "batch",
                    },
                },
            }
        out.append(json.dumps({"custom_id": h[:64], "result": result}))
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(out) + "\n")
    os.replace(tmp, path)
    meta = {"lines": lines, "seed": seed, **counts, "bytes": path.stat().st_size}
    meta_path.write_text(json.dumps(meta, indent=1))
    return path, meta


def reference(path: str, out_dir: str) -> dict:
    import pandas  # noqa: F401 - pyarrow imports it on its first Python-value conversion; not throughput
    import pyarrow as pa
    import pyarrow.parquet as pq

    from batch_pipeline.core.ledger.executor import RAW_RESULT_SCHEMA

    cpu0, started = cpu_s(), time.perf_counter()
    cols: dict[str, list] = {name: [] for name in RAW_RESULT_SCHEMA.names}
    append = [cols[n].append for n in RAW_RESULT_SCHEMA.names]
    loads, dumps = json.loads, json.dumps
    with open(path, "rb") as f:
        for line in f:
            obj = loads(line)
            result = obj.get("result") or {}
            message = result.get("message") or {}
            usage = message.get("usage") or {}
            block = (message.get("content") or [{}])[0]
            error = (result.get("error") or {}).get("error") or {}
            text = (
                dumps(block["input"], separators=(",", ":")) if block.get("type") == "tool_use" else block.get("text")
            )
            values = (
                obj.get("custom_id"),
                200 if result.get("type") == "succeeded" else None,
                text,
                message.get("stop_reason"),
                usage.get("input_tokens"),
                usage.get("cache_read_input_tokens"),
                usage.get("output_tokens"),
                error.get("type") or result.get("type"),
                error.get("message"),
                message.get("id"),
                line.decode("utf-8").rstrip("\n"),
            )
            for add, value in zip(append, values):
                add(value)
    table = pa.table(cols, schema=RAW_RESULT_SCHEMA)
    pq.write_table(table, os.path.join(out_dir, "results.parquet"), compression="zstd")
    return {
        "variant": "reference",
        "seconds": time.perf_counter() - started,
        "cpu_s": cpu_s() - cpu0,
        "rows": table.num_rows,
        "succeeded": None,
        "peak_rss_mb": maxrss_mb(),
    }


def ours(path: str, work: str) -> dict:
    import pyarrow as pa
    import pyarrow.compute as pc

    from batch_pipeline.core.ledger.executor import ShardWork
    from batch_pipeline.core.ledger.result_parts import new_part, write_part, write_payload
    from batch_pipeline.core.run.results import build_results
    from batch_pipeline.core.run.threads import default_workers, ordered_map
    from batch_pipeline.core.store import BackgroundWrites
    from batch_pipeline.executors.anthropic.format import parse_results_block
    from batch_pipeline.executors.jsonl_blocks import iter_blocks

    _spec, plan, price, store = _setup_ours(work)
    with open(path, "rb") as f:  # setup: the attempt's request IDs
        ids = [line[15:79].decode() for line in f]
    work_ = ShardWork(JOB, "s00001", 1, f"{JOB}:s00001:1", plan, pa.table({"request_id": ids}))
    cpu0, started = cpu_s(), time.perf_counter()
    rows = succeeded = flush = 0
    with BackgroundWrites(depth=4, workers=2) as writes, open(path, "rb") as f:
        blocks = iter_blocks(iter(lambda: f.read(1 << 20), b""))
        for raw in ordered_map(parse_results_block, blocks, default_workers()):
            flush += 1
            rel = new_part(JOB, "s00001", 1, flush)
            payload = writes.submit(write_payload, store, JOB, rel, 1, raw)
            table = build_results(
                raw,
                work_,
                backend="anthropic_batch",
                pricing="batch",
                prompt_version="v1",
                price=price,
                provider_batch_id="msgbatch_bench",
            )
            writes.submit(write_part, store, rel, table, payload)
            rows += table.num_rows
            succeeded += pc.sum(pc.equal(table.column("status"), "succeeded")).as_py() or 0
    return {
        "variant": "ours",
        "seconds": time.perf_counter() - started,
        "cpu_s": cpu_s() - cpu0,
        "rows": rows,
        "succeeded": succeeded,
        "blocks": flush,
        "peak_rss_mb": maxrss_mb(),
    }


class _StubExecutor:
    """Serves each shard's results file as ``AnthropicBatchExecutor.fetch`` does (1 MiB chunks, 16 MB blocks,
    parsed on the parse workers)."""

    name = "anthropic_batch"
    pricing = "batch"
    poll_interval_s = 1.0
    max_requests_per_batch = 100_000
    max_bytes_per_batch = 256 * 2**20

    def __init__(self, by_batch: dict[str, bytes]):
        from batch_pipeline.core.run.threads import default_workers

        self.by_batch = by_batch
        self.parse_workers = default_workers()  # once, as BatchBackend does (it reads the cgroup's CPU quota)

    def fetch(self, handle):
        from batch_pipeline.core.run.threads import ordered_map
        from batch_pipeline.executors.anthropic.format import parse_results_block
        from batch_pipeline.executors.jsonl_blocks import iter_blocks

        data = self.by_batch[handle.batch_id]
        chunks = (data[i : i + (1 << 20)] for i in range(0, len(data), 1 << 20))
        yield from ordered_map(parse_results_block, iter_blocks(chunks), self.parse_workers)

    def submit(self, work):
        raise NotImplementedError

    def poll(self, handle):
        raise NotImplementedError

    def cancel(self, handle):
        raise NotImplementedError

    def find(self, key, request_ids=None, not_before=None):
        return None


def ours_runner(path: str, work: str, shard_lines: int = 5000) -> dict:
    from batch_pipeline.core.ledger.attempts import Attempt, IntentRecord
    from batch_pipeline.core.ledger.executor import BatchHandle
    from batch_pipeline.core.run.runner import ShardRunner

    spec, _plan, price, store = _setup_ours(work)
    with open(path, "rb") as f:  # setup (untimed): shards of shard_lines consecutive lines
        lines = f.readlines()
    by_batch: dict[str, bytes] = {}
    attempts = []
    for s in range(0, len(lines), shard_lines):
        sid = f"s{s // shard_lines + 1:05d}"
        chunk = lines[s : s + shard_lines]
        by_batch[f"msgbatch_{sid}"] = b"".join(chunk)
        attempts.append(
            (
                Attempt(
                    1, {"intent": IntentRecord(key=f"{JOB}:{sid}:1", request_ids=[ln[15:79].decode() for ln in chunk])}
                ),
                BatchHandle("anthropic_batch", f"msgbatch_{sid}", f"{JOB}:{sid}:1"),
            )
        )
    del lines
    runner = ShardRunner(spec, store, _StubExecutor(by_batch), price)
    cpu0, started = cpu_s(), time.perf_counter()
    rows = ok = 0
    for attempt, handle in attempts:
        r, k, _systemic = runner._ingest(attempt, handle)
        rows += r
        ok += k
    return {
        "variant": "ours_runner",
        "seconds": time.perf_counter() - started,
        "cpu_s": cpu_s() - cpu0,
        "rows": rows,
        "succeeded": ok,
        "shards": len(attempts),
        "peak_rss_mb": maxrss_mb(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, default=500_000)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=5, help="runs of each variant, interleaved (best and median)")
    ap.add_argument("--shard-lines", type=int, default=5000, help="lines per shard for ours_runner")
    args = ap.parse_args(argv)
    path, meta = generate(args.lines, args.seed)
    print(
        f"anthropic ingest: {args.lines:,} lines, {meta['bytes'] / 2**20:,.0f} MiB; mix "
        + ", ".join(f"{name} {meta[name]:,}" for name, _ in MIX),
        flush=True,
    )
    with open(path, "rb") as f:  # warm the page cache
        while f.read(64 * 2**20):
            pass
    variants = ("reference", "ours", "ours_runner")
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    checks = []
    for _ in range(args.repeat):
        for variant in variants:
            work = tempfile.mkdtemp(prefix="ingest_anthropic-")
            try:
                extra = (args.shard_lines,) if variant == "ours_runner" else ()
                r = run_in_child(f"benchmarks.ingest_anthropic_bench:{variant}", str(path), work, *extra)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            r["lines_per_s"] = args.lines / r["seconds"]
            r["load"] = load()
            runs[variant].append(r)
            print(
                f"  {variant:11s} {r['seconds']:6.2f} s (cpu {r['cpu_s']:.2f} s)  {r['lines_per_s']:>10,.0f} "
                f"lines/s  load {r['load']:.1f}  peak RSS {r['peak_rss_mb']:,.0f} MB"
                + (f"  succeeded {r['succeeded']:,}" if r["succeeded"] is not None else ""),
                flush=True,
            )
            checks.append((f"{variant}: rows == lines", r["rows"] == args.lines))
            if variant != "reference":
                checks.append((f"{variant}: succeeded == generated good labels", r["succeeded"] == meta["ok"]))
    summary: dict[str, dict] = {}
    for v, rs in runs.items():
        rates = [r["lines_per_s"] for r in rs]
        summary[v] = {
            "best_lines_per_s": max(rates),
            "median_lines_per_s": statistics.median(rates),
            "all_lines_per_s": rates,
            "loads": [r["load"] for r in rs],
        }
    print(f"  best / median of {args.repeat} (lines/s), ratio to the reference's best / median:")
    for v, r in summary.items():
        ratio = ""
        if v != "reference":
            r["ratio_best"] = r["best_lines_per_s"] / summary["reference"]["best_lines_per_s"]
            r["ratio_median"] = r["median_lines_per_s"] / summary["reference"]["median_lines_per_s"]
            ratio = f"  ratio {r['ratio_best']:.2f}x / {r['ratio_median']:.2f}x"
        print(f"    {v:11s} {r['best_lines_per_s']:>10,.0f} / {r['median_lines_per_s']:>10,.0f}{ratio}")
    checks.append(("ours >= 300k lines/s (best)", summary["ours"]["best_lines_per_s"] >= 300_000))
    checks.append(("ours_runner >= 300k lines/s (best)", summary["ours_runner"]["best_lines_per_s"] >= 300_000))
    checks = list(dict(checks).items())  # one line per check (each repeat checked the same)
    for name, ok in checks:
        print(f"  [{'ok' if ok else 'MISS'}] {name}")
    (OUT / f"ingest_anthropic_bench-{args.lines}.json").write_text(
        json.dumps({"meta": meta, "summary": summary, "runs": runs, "checks": dict(checks)}, indent=1, default=str)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
