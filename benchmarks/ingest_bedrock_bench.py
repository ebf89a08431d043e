"""Results ingestion for Amazon Bedrock batch inference: a ``.jsonl.out`` file -> validated result rows in the store.

Input (generated once, cached under ``benchmarks/out/``): the output file of a Claude choice job as Bedrock writes
it (and the sandbox): every line echoes its ``modelInput`` (the Bedrock Messages body: anthropic_version, system,
the forced ``answer`` tool with its schema, the user message of 100-300 characters) next to its ``modelOutput``
(the InvokeModel body: one ``tool_use`` block with ``{"label": ...}``, usage) or its ``error``
(``{"errorCode", "errorMessage"}``); ~97% good labels, 0.5% cut at ``max_tokens`` (empty input), 0.5% labels outside
the set, 1% errorCode 500, 0.5% 400, 0.5% 429.

Variants, each in its own spawned process, timed in one run:
- reference: plain Python, ``json.loads`` per line, pick the ``RAW_RESULT_SCHEMA`` fields (tool input re-dumped),
  one zstd Parquet file. No validation, no cost.
- ours: what ``BedrockBatchExecutor.fetch`` + ``ShardRunner._ingest`` run: 1 MiB reads -> ``iter_blocks``
  (16 MB) -> ``parse_output_block`` on the parse workers -> ``build_results`` -> ``write_results`` on a
  ``BackgroundWrites`` thread.

Target (issue 9: as for Anthropic): ours >= 300k lines/s.

    python benchmarks/ingest_bedrock_bench.py [--lines 500000] [--repeat 2]
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
    ("server", 0.99),
    ("invalid", 0.995),
    ("throttled", 1.0),
)
ERRORS = {
    "server": (500, "Internal server error"),
    "invalid": (400, "Input is too long for requested model."),
    "throttled": (429, "Too many requests, please wait before trying again."),
}
WORDS = (
    "invoice charge refund login password crash error screen export feature please account billing "
    "app sync payment upgrade team workspace report slow broken cannot help thanks urgent"
).split()
MODEL_INPUT = {
    "anthropic_version": "bedrock-2023-05-31",
    "max_tokens": 16,
    "temperature": 0.0,
    "system": "You label customer support tickets. Answer with exactly one label from the allowed set.",
    "tools": [
        {
            "name": "answer",
            "description": "Give the answer in the required structure.",
            "input_schema": {
                "type": "object",
                "properties": {"label": {"type": "string", "enum": LABELS}},
                "required": ["label"],
                "additionalProperties": False,
            },
        }
    ],
    "tool_choice": {"type": "tool", "name": "answer"},
}


def generate(lines: int, seed: int) -> tuple[Path, dict]:
    import numpy as np

    path, meta_path = OUT / f"bedrock-out-{lines}-seed{seed}.jsonl.out", OUT / f"bedrock-out-{lines}-seed{seed}.json"
    if path.exists() and meta_path.exists():
        return path, json.loads(meta_path.read_text())
    rng = np.random.default_rng(seed)
    raw, kind = rng.bytes(48 * lines), rng.random(lines)
    label, length = rng.integers(0, len(LABELS), lines).tolist(), rng.integers(15, 45, lines).tolist()
    words = rng.integers(0, len(WORDS), 45 * lines).tolist()
    counts = dict.fromkeys((name for name, _ in MIX), 0)
    OUT.mkdir(exist_ok=True)
    frame = json.dumps(MODEL_INPUT, separators=(",", ":"))[:-1]
    out: list[str] = []
    for i in range(lines):
        h = raw[i * 48 : (i + 1) * 48].hex()
        name = next(n for n, upper in MIX if kind[i] < upper)
        counts[name] += 1
        prompt = " ".join(WORDS[w] for w in words[i * 45 : i * 45 + length[i]])
        model_input = frame + ',"messages":[{"role":"user","content":' + json.dumps(prompt) + "}]}"
        if name in ERRORS:
            code, message = ERRORS[name]
            tail = json.dumps({"errorCode": code, "errorMessage": message})
            out.append(f'{{"recordId":"{h[:64]}","modelInput":{model_input},"error":{tail}}}')
            continue
        tool_input = {} if name == "truncated" else {"label": "spam" if name == "bad_label" else LABELS[label[i]]}
        output = {
            "id": f"msg_bdrk_{h[64:88]}",
            "type": "message",
            "role": "assistant",
            "model": "claude-3-5-haiku-20241022",
            "content": [{"type": "tool_use", "id": f"toolu_bdrk_{h[72:96]}", "name": "answer", "input": tool_input}],
            "stop_reason": "max_tokens" if name == "truncated" else "tool_use",
            "stop_sequence": None,
            "usage": {"input_tokens": 380 + length[i], "output_tokens": 3 if name == "truncated" else 12},
        }
        out.append(f'{{"recordId":"{h[:64]}","modelInput":{model_input},"modelOutput":{json.dumps(output)}}}')
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
            output = obj.get("modelOutput") or {}
            usage = output.get("usage") or {}
            block = (output.get("content") or [{}])[0]
            error = obj.get("error") or {}
            text = (
                dumps(block["input"], separators=(",", ":")) if block.get("type") == "tool_use" else block.get("text")
            )
            values = (
                obj.get("recordId"),
                200 if output else error.get("errorCode"),
                text,
                output.get("stop_reason"),
                usage.get("input_tokens"),
                usage.get("cache_read_input_tokens", 0 if output else None),
                usage.get("output_tokens"),
                None if output else str(error.get("errorCode")),
                error.get("errorMessage"),
                output.get("id"),
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
    from batch_pipeline.core.ledger.result_parts import write_results
    from batch_pipeline.core.run.results import build_results
    from batch_pipeline.core.run.threads import default_workers
    from batch_pipeline.core.store import BackgroundWrites
    from batch_pipeline.executors.bedrock.format import parse_output_block
    from batch_pipeline.executors.jsonl_blocks import parse_stream

    _spec, plan, price, store = _setup_ours(work)
    with open(path, "rb") as f:  # setup: the attempt's request IDs
        ids = [line[13:77].decode() for line in f]
    work_ = ShardWork(JOB, "s00001", 1, f"{JOB}:s00001:1", plan, pa.table({"request_id": ids}))
    cpu0, started = cpu_s(), time.perf_counter()
    rows = succeeded = flush = 0
    with BackgroundWrites(depth=2) as writes, open(path, "rb") as f:
        for raw in parse_stream(parse_output_block, iter(lambda: f.read(1 << 20), b""), default_workers()):
            table = build_results(
                raw,
                work_,
                backend="bedrock_batch",
                pricing="batch",
                prompt_version="v1",
                price=price,
                provider_batch_id="arn:aws:bedrock:bench",
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
    ap.add_argument("--seed", type=int, default=9)
    ap.add_argument("--repeat", type=int, default=2, help="runs of each variant, alternating; the best is compared")
    args = ap.parse_args(argv)
    path, meta = generate(args.lines, args.seed)
    print(
        f"bedrock ingest: {args.lines:,} lines, {meta['bytes'] / 2**20:,.0f} MiB; mix "
        + ", ".join(f"{name} {meta[name]:,}" for name, _ in MIX),
        flush=True,
    )
    result = compare_ingest("ingest_bedrock_bench", path, args.lines, meta["ok"], args.repeat)
    (OUT / f"ingest_bedrock_bench-{args.lines}.json").write_text(
        json.dumps({"meta": meta, **result}, indent=1, default=str)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
