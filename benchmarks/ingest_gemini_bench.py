"""Results ingestion for the Gemini Developer API batch mode: responses JSONL -> validated result rows in the store.

Input (generated once, cached under ``benchmarks/out/``): the responses file of a choice job as the sandbox and the
wire format write it (``{"key", "response": GenerateContentResponse}`` / ``{"key", "error": google.rpc.Status}``):
``responseJsonSchema`` answers ``{"label": ...}``; ~97% good labels, 0.5% cut at ``MAX_TOKENS``, 0.5% labels outside
the set, 0.5% ``SAFETY`` refusals (no content), 1% ``INTERNAL`` (code 13), 0.5% ``INVALID_ARGUMENT`` (code 3).

Variants, each in its own spawned process, timed in one run:
- reference: plain Python, ``json.loads`` per line, pick the ``RAW_RESULT_SCHEMA`` fields, one zstd Parquet file.
  No validation, no cost.
- ours: what ``GeminiBatchExecutor.fetch`` + ``ShardRunner._ingest`` run: 1 MiB reads -> ``iter_blocks`` (16 MB)
  -> ``format.parse_block`` on the parse workers -> ``build_results`` -> ``write_results`` on a
  ``BackgroundWrites`` thread.

Target (issue 9): ours >= 300k lines/s.

    python benchmarks/ingest_gemini_bench.py [--lines 500000] [--repeat 2]
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from benchmarks._harness import OUT, compare_ingest, cpu_s, maxrss_mb  # noqa: E402
from benchmarks.ingest_bench import JOB, LABELS, _setup_ours  # noqa: E402

MIX = (
    ("ok", 0.97),
    ("truncated", 0.975),
    ("bad_label", 0.98),
    ("refused", 0.985),
    ("internal", 0.995),
    ("invalid", 1.0),
)


def generate(lines: int, seed: int) -> tuple[Path, dict]:
    import numpy as np

    path, meta_path = OUT / f"gemini-results-{lines}-seed{seed}.jsonl", OUT / f"gemini-results-{lines}-seed{seed}.json"
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
        if name in ("internal", "invalid"):
            error = (
                {"code": 13, "message": "Internal error encountered."}
                if name == "internal"
                else {
                    "code": 3,
                    "message": "The input token count (1048577) exceeds the maximum number of tokens "
                    "allowed (1048576).",
                }
            )
            out.append(json.dumps({"key": h[:64], "error": error}))
            continue
        usage = {
            "promptTokenCount": prompt[i] + cached[i],
            "candidatesTokenCount": 3 if name == "truncated" else 9,
            "totalTokenCount": prompt[i] + cached[i] + 9,
            "promptTokensDetails": [{"modality": "TEXT", "tokenCount": prompt[i] + cached[i]}],
        }
        if cached[i]:
            usage["cachedContentTokenCount"] = cached[i]
        if name == "refused":
            candidate = {
                "finishReason": "SAFETY",
                "index": 0,
                "safetyRatings": [
                    {"category": "HARM_CATEGORY_DANGEROUS_CONTENT", "probability": "HIGH", "blocked": True}
                ],
            }
        else:
            text = (
                '{"label": "bu'
                if name == "truncated"
                else json.dumps({"label": "spam" if name == "bad_label" else LABELS[label[i]]})
            )
            candidate = {
                "content": {"role": "model", "parts": [{"text": text}]},
                "finishReason": "MAX_TOKENS" if name == "truncated" else "STOP",
                "index": 0,
            }
        out.append(
            json.dumps(
                {
                    "key": h[:64],
                    "response": {
                        "candidates": [candidate],
                        "usageMetadata": usage,
                        "modelVersion": "gemini-2.5-flash",
                        "responseId": h[64:86],
                    },
                }
            )
        )
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
    loads = json.loads
    with open(path, "rb") as f:
        for line in f:
            obj = loads(line)
            response, error = obj.get("response"), obj.get("error")
            if error is not None:
                values = (
                    obj.get("key"),
                    500 if error.get("code") == 13 else 400,
                    None,
                    None,
                    None,
                    None,
                    None,
                    str(error.get("code")),
                    error.get("message"),
                    None,
                )
            else:
                candidate = (response.get("candidates") or [{}])[0]
                parts = (candidate.get("content") or {}).get("parts") or []
                usage = response.get("usageMetadata") or {}
                values = (
                    obj.get("key"),
                    200,
                    "".join(p.get("text", "") for p in parts) or None,
                    candidate.get("finishReason"),
                    usage.get("promptTokenCount"),
                    usage.get("cachedContentTokenCount", 0),
                    usage.get("candidatesTokenCount", 0) + usage.get("thoughtsTokenCount", 0),
                    None,
                    None,
                    response.get("responseId"),
                )
            for add, value in zip(append, (*values, line.decode("utf-8").rstrip("\n"))):
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
    from batch_pipeline.core.ledger.result_parts import write_results
    from batch_pipeline.core.run.results import build_results
    from batch_pipeline.core.run.threads import default_workers
    from batch_pipeline.core.store import BackgroundWrites
    from batch_pipeline.executors.google.format import parse_result_stream

    _spec, plan, price, store = _setup_ours(work)
    with open(path, "rb") as f:  # setup: the attempt's request IDs
        ids = [line[8:72].decode() for line in f]
    work_ = ShardWork(JOB, "s00001", 1, f"{JOB}:s00001:1", plan, pa.table({"request_id": ids}))
    cpu0, started = cpu_s(), time.perf_counter()
    rows = succeeded = flush = 0
    with BackgroundWrites(depth=2) as writes, open(path, "rb") as f:
        for raw in parse_result_stream(iter(lambda: f.read(1 << 20), b""), default_workers()):
            table = build_results(
                raw,
                work_,
                backend="gemini_batch",
                pricing="batch",
                prompt_version="v1",
                price=price,
                provider_batch_id="batches/bench",
            )
            flush += 1
            writes.submit(write_results, store, JOB, "s00001", 1, flush, table)
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, default=500_000)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=2, help="runs of each variant, alternating; the best is compared")
    args = ap.parse_args(argv)
    path, meta = generate(args.lines, args.seed)
    print(
        f"gemini ingest: {args.lines:,} lines, {meta['bytes'] / 2**20:,.0f} MiB; mix "
        + ", ".join(f"{name} {meta[name]:,}" for name, _ in MIX),
        flush=True,
    )
    result = compare_ingest("ingest_gemini_bench", path, args.lines, meta["ok"], args.repeat)
    (OUT / f"ingest_gemini_bench-{args.lines}.json").write_text(
        json.dumps({"meta": meta, **result}, indent=1, default=str)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
