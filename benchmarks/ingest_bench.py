"""Results ingestion throughput: OpenAI batch output JSONL -> validated result rows in the store.

Input (generated once, cached under ``benchmarks/out/``): an output file and an error file of an OpenAI
batch, ``--lines`` lines in all, in the format of the provider wire formats (``PROVIDER_PROTOCOLS.md`` of the design notes) (and of the
sandbox): chat-completion bodies whose content is ``{"label":"..."}`` with usage; ~97% good labels,
0.5% truncated (``finish_reason: length``), 0.5% labels outside the set, and in the error file 1% HTTP
500 ``server_error``, 0.5% HTTP 400 ``context_length_exceeded``, 0.5% ``batch_expired`` lines.

Variants, each in its own spawned process (peak RSS per variant), timed in one script run:
- reference: plain Python, ``json.loads`` per line, pick the ``RAW_RESULT_SCHEMA`` fields, append to
  lists, write one Parquet file (zstd). No validation, no cost.
- ours: the path ``ShardRunner._ingest`` runs: the files read in 1 MiB chunks -> ``iter_blocks`` (16 MB) ->
  ``parse_output_block`` -> per block, the payload part (the raw lines) queued at once on one writer thread,
  ``build_results`` (validation against a ``choice`` output, cost, provenance), the result part on a second
  writer thread, landing after its payload (``BackgroundWrites``, 2 workers, at most 4 writes queued).
- ours_runner: ``ShardRunner._ingest`` itself (adds the ``is_in`` filter against the attempt's IDs and the
  counting) over shards of 5,000 lines, several shards at a time as ``ShardDriver.collect_phases`` runs a run's
  shards (``Settings.collect_shards_at_once``, default 3: ``ordered_map`` on a pool of its own, results in shard
  order), with a stub executor serving each shard's lines as the OpenAI executor's ``fetch`` does (1 MiB chunks,
  the file's size given as its content-length: a 5,000-line shard is parsed in one block per worker, and the
  blocks' tables joined again into one flush, one pair of parts).
- ours_runner_serial: the same, one shard after another (``collect_shards_at_once: 1``; what ``ours_runner``
  measured before 2026-12-02 17:00).

pyarrow imports pandas the first time it converts a Python value (``pa.array``, ``pa.scalar``, a compute
function with a literal), ~0.35 s once per process; every variant imports it before its timer starts (under
Dagster it is imported anyway), so the figures are steady-state throughput.

Targets: ours >= 400k lines/s (issue 2); ours_runner >= 300k lines/s (issue 10). Each variant runs ``--repeat``
times (default 5), the variants interleaved; best and median are reported, with the ratios to the reference's
best and median of the same run.

``--breakdown`` times the steps one by one (parse, validate, build, write) and the alternatives measured for them
(Arrow's and Polars' JSON readers, the per-line path, Parquet codecs and levels with the resulting sizes).

    python benchmarks/ingest_bench.py [--lines 500000] [--repeat 5] [--sections] [--breakdown] [--profile]
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from benchmarks._harness import OUT, cpu_s, load, maxrss_mb, run_in_child  # noqa: E402

JOB = "ingest_bench"
LABELS = ["billing", "bug", "feature_request", "account", "other"]
SHARD = 5000
VARIANTS = ("reference", "ours", "ours_runner", "ours_runner_serial")
MIX_KEYS = ("ok", "truncated", "bad_label", "http_500", "http_400", "expired")
SPEC_YAML = """\
name: ingest_bench
input: {path: unused.jsonl, text_field: body}
prompt: {version: v1, template: "{body}"}
model: gpt-4o-mini
backend: {name: openai_batch}
sampling: {temperature: 0, max_tokens: 16}
output:
  choice: [billing, bug, feature_request, account, other]
"""
PRICE = {
    "input_per_mtok": 0.15,
    "cached_input_per_mtok": 0.075,
    "output_per_mtok": 0.6,
    "batch_discount": 0.5,
    "checked": "2026-01-01",
}


# -- input generation -------------------------------------------------------------------------------
def paths_for(lines: int, seed: int) -> tuple[Path, Path, Path]:
    stem = OUT / f"openai-output-{lines}-seed{seed}"
    return Path(f"{stem}.jsonl"), Path(f"{stem}-errors.jsonl"), Path(f"{stem}.json")


def generate(lines: int, seed: int) -> dict:
    import numpy as np

    out_path, err_path, meta_path = paths_for(lines, seed)
    if out_path.exists() and err_path.exists() and meta_path.exists():
        return json.loads(meta_path.read_text())
    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    raw = rng.bytes(64 * lines)
    kind = rng.random(lines)
    label = rng.integers(0, len(LABELS), lines).tolist()
    prompt = rng.integers(80, 420, lines).tolist()
    cached = np.where(rng.random(lines) < 0.3, 64, 0).tolist()
    created = 1764480000
    counts = {"ok": 0, "truncated": 0, "bad_label": 0, "http_500": 0, "http_400": 0, "expired": 0}
    OUT.mkdir(exist_ok=True)
    tmp_out, tmp_err = out_path.with_suffix(".tmp"), err_path.with_suffix(".tmp")
    with open(tmp_out, "w") as fo, open(tmp_err, "w") as fe:
        bo: list[str] = []
        be: list[str] = []
        for i in range(lines):
            b = raw[i * 64 : (i + 1) * 64].hex()
            rid, line_id, req_id, cmpl = b[:64], b[64:88], b[88:120], b[32:61]
            k = kind[i]
            head = f'{{"id": "batch_req_{line_id}", "custom_id": "{rid}", '
            if k < 0.98:
                if k < 0.97:
                    content, finish, comp = f'{{\\"label\\":\\"{LABELS[label[i]]}\\"}}', "stop", 6
                    counts["ok"] += 1
                elif k < 0.975:
                    content, finish, comp = '{\\"label\\":\\"bil', "length", 3
                    counts["truncated"] += 1
                else:
                    content, finish, comp = '{\\"label\\":\\"spam\\"}', "stop", 6
                    counts["bad_label"] += 1
                p = prompt[i]
                bo.append(
                    f'{head}"response": {{"status_code": 200, "request_id": "req_{req_id}", "body": '
                    f'{{"id": "chatcmpl-{cmpl}", "object": "chat.completion", "created": {created + i // 1000}, '
                    f'"model": "gpt-4o-mini-2024-07-18", "choices": [{{"index": 0, "message": {{"role": '
                    f'"assistant", "content": "{content}", "refusal": null, "annotations": []}}, "logprobs": null, '
                    f'"finish_reason": "{finish}"}}], "usage": {{"prompt_tokens": {p}, "completion_tokens": {comp}, '
                    f'"total_tokens": {p + comp}, "prompt_tokens_details": {{"cached_tokens": {cached[i]}, '
                    f'"audio_tokens": 0}}, "completion_tokens_details": {{"reasoning_tokens": 0, "audio_tokens": 0, '
                    f'"accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}}}}, "service_tier": '
                    f'"default", "system_fingerprint": "fp_b376dfbbd5"}}}}, "error": null}}\n'
                )
            elif k < 0.995:
                if k < 0.99:
                    status, msg, typ, code = (
                        500,
                        "The server had an error processing your request.",
                        "server_error",
                        "server_error",
                    )
                    counts["http_500"] += 1
                else:
                    status, msg, typ, code = (
                        400,
                        (
                            "This model's maximum context length is 128000 tokens. However, "
                            "your messages resulted in 131072 tokens."
                        ),
                        "invalid_request_error",
                        "context_length_exceeded",
                    )
                    counts["http_400"] += 1
                be.append(
                    f'{head}"response": {{"status_code": {status}, "request_id": "req_{req_id}", "body": '
                    f'{{"error": {{"message": "{msg}", "type": "{typ}", "param": null, "code": "{code}"}}}}}}, '
                    f'"error": null}}\n'
                )
            else:
                be.append(
                    f'{head}"response": null, "error": {{"code": "batch_expired", "message": "This request '
                    f'could not be executed before the completion window expired."}}}}\n'
                )
                counts["expired"] += 1
            if len(bo) >= 20000:
                fo.write("".join(bo))
                bo.clear()
            if len(be) >= 20000:
                fe.write("".join(be))
                be.clear()
        fo.write("".join(bo))
        fe.write("".join(be))
    os.replace(tmp_out, out_path)
    os.replace(tmp_err, err_path)
    meta = {
        "lines": lines,
        "seed": seed,
        **counts,
        "bytes": out_path.stat().st_size + err_path.stat().st_size,
        "seconds": round(time.perf_counter() - started, 2),
    }
    meta_path.write_text(json.dumps(meta, indent=1))
    return meta


def request_ids_of(files: list[str]) -> list[str]:
    """custom_id of every line (setup only: the attempt's request IDs)."""
    out = []
    for p in files:
        with open(p, "rb") as f:
            for line in f:
                i = line.index(b'"custom_id": "') + 14
                out.append(line[i : i + 64].decode())
    return out


# -- variants (spawned children) --------------------------------------------------------------------
def reference(files: list[str], out_dir: str) -> dict:
    import json as _json

    import pandas  # noqa: F401 - pa.table() imports it on first use; not part of the throughput
    import pyarrow as pa
    import pyarrow.parquet as pq

    from batch_pipeline.core.ledger.executor import RAW_RESULT_SCHEMA

    rss_before = maxrss_mb()
    cpu0 = cpu_s()
    started = time.perf_counter()
    cols: dict[str, list] = {name: [] for name in RAW_RESULT_SCHEMA.names}
    (rid, http, text, finish, in_tok, cached, out_tok, code, message, preq, raw) = (
        cols[n].append for n in RAW_RESULT_SCHEMA.names
    )
    loads = _json.loads
    lines = 0
    for path in files:
        with open(path, "rb") as f:
            for line in f:
                if not line.strip():
                    continue
                lines += 1
                obj = loads(line)
                resp = obj.get("response") or {}
                body = resp.get("body") or {}
                choices = body.get("choices") or [{}]
                msg = choices[0].get("message") or {}
                usage = body.get("usage") or {}
                err = obj.get("error") or body.get("error") or {}
                rid(obj.get("custom_id"))
                http(resp.get("status_code"))
                text(msg.get("content"))
                finish(choices[0].get("finish_reason"))
                in_tok(usage.get("prompt_tokens"))
                cached((usage.get("prompt_tokens_details") or {}).get("cached_tokens"))
                out_tok(usage.get("completion_tokens"))
                code(err.get("code") or err.get("type"))
                message(err.get("message"))
                preq(resp.get("request_id"))
                raw(line.decode("utf-8").rstrip("\n"))
    table = pa.table(cols, schema=RAW_RESULT_SCHEMA)
    pq.write_table(table, os.path.join(out_dir, "results.parquet"), compression="zstd")
    seconds = time.perf_counter() - started
    return {
        "variant": "reference",
        "seconds": seconds,
        "cpu_s": cpu_s() - cpu0,
        "lines": lines,
        "rows": table.num_rows,
        "peak_rss_mb": maxrss_mb(),
        "rss_after_imports_mb": rss_before,
    }


def _setup_ours(work: str):
    import pandas  # noqa: F401 - pyarrow imports it on its first Python-value conversion; not throughput

    from batch_pipeline.core.ledger.executor import RequestPlan
    from batch_pipeline.core.pricing.cost import Price
    from batch_pipeline.core.spec.loading import parse_spec
    from batch_pipeline.core.store import Store

    spec = parse_spec(SPEC_YAML)
    return spec, RequestPlan.from_spec(spec), Price.model_validate(PRICE), Store(Path(work) / "store")


def ours(files: list[str], work: str, sections: bool, profile: bool) -> dict:
    """The executor's path as ``ShardRunner._ingest`` runs it: 1 MiB reads -> ``iter_blocks`` (16 MB) ->
    ``parse_output_block`` -> ``build_results`` -> ``write_results`` on a ``BackgroundWrites`` thread."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from batch_pipeline.core.ledger.executor import ShardWork
    from batch_pipeline.core.ledger.result_parts import new_part, write_part, write_payload
    from batch_pipeline.core.quality import validate as validate_mod
    from batch_pipeline.core.run import results as results_mod
    from batch_pipeline.core.run.results import build_results
    from batch_pipeline.core.run.threads import default_workers, ordered_map
    from batch_pipeline.core.store import BackgroundWrites
    from batch_pipeline.executors.jsonl_blocks import iter_blocks
    from batch_pipeline.executors.openai.format import parse_output_block

    workers = default_workers()  # what the executor uses
    spec, plan, price, store = _setup_ours(work)
    ids = request_ids_of(files)
    work_ = ShardWork(JOB, "s00001", 1, f"{JOB}:s00001:1", plan, pa.table({"request_id": ids}))
    secs: dict[str, float] = {}
    thread_cpu: dict[str, float] = {}

    def add(name: str, wall: float, cpu: float) -> None:
        secs[name] = secs.get(name, 0.0) + wall
        thread_cpu[name] = thread_cpu.get(name, 0.0) + cpu

    if sections:  # time validate() inside build_results too
        inner = validate_mod.validate

        def timed_validate(*a, **kw):
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return inner(*a, **kw)
            finally:
                add("  of which validate()", time.perf_counter() - t0, time.thread_time() - c0)

        results_mod.validate = timed_validate

    def write_raw(rel: str, raw) -> None:
        t0, c0 = time.perf_counter(), time.thread_time()
        write_payload(store, JOB, rel, 1, raw)
        add("[writer] write_payload (LZ4 payload part)", time.perf_counter() - t0, time.thread_time() - c0)

    def write(rel: str, table, after) -> None:
        t0, c0 = time.perf_counter(), time.thread_time()
        write_part(store, rel, table, after)
        add("[writer] write_part (result part, after its payload)", time.perf_counter() - t0, time.thread_time() - c0)

    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile()
    rss_before = maxrss_mb()
    cpu0 = cpu_s()
    started = time.perf_counter()
    if prof:
        prof.enable()
    rows = succeeded = lines = flush = 0

    def tick(name: str, since: tuple[float, float]) -> tuple[float, float]:
        now = time.perf_counter(), time.thread_time()
        add(name, now[0] - since[0], now[1] - since[1])
        return now

    def parse(block: bytes):
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return parse_output_block(block)
        finally:
            add("[parse workers] parse_output_block", time.perf_counter() - t0, time.thread_time() - c0)

    with BackgroundWrites(depth=4, workers=2) as writes:
        for path in files:
            with open(path, "rb") as f:
                blocks = iter_blocks(iter(lambda: f.read(1 << 20), b""))
                t = time.perf_counter(), time.thread_time()
                for raw in ordered_map(parse, blocks, workers):
                    t = tick("read 1 MiB chunks + iter_blocks, wait for the parsed block", t)
                    flush += 1
                    rel = new_part(JOB, "s00001", 1, flush)
                    payload = writes.submit(write_raw, rel, raw)
                    t = tick("BackgroundWrites.submit payload (waits while 4 writes are queued)", t)
                    table = build_results(
                        raw,
                        work_,
                        backend="openai_batch",
                        pricing="batch",
                        prompt_version="v1",
                        price=price,
                        provider_batch_id="batch_bench",
                    )
                    t = tick("build_results", t)
                    writes.submit(write, rel, table, payload)
                    t = tick("BackgroundWrites.submit result part", t)
                    lines += raw.num_rows
                    rows += table.num_rows
                    succeeded += pc.sum(pc.equal(table.column("status"), "succeeded")).as_py() or 0
                    t = tick("bench bookkeeping", t)
        t = time.perf_counter(), time.thread_time()
    tick("BackgroundWrites close (last writes)", t)
    if prof:
        prof.disable()
    seconds = time.perf_counter() - started
    out = {
        "variant": "ours",
        "parse_workers": workers,
        "seconds": seconds,
        "cpu_s": cpu_s() - cpu0,
        "lines": lines,
        "rows": rows,
        "succeeded": succeeded,
        "blocks": flush,
        "peak_rss_mb": maxrss_mb(),
        "rss_after_imports_mb": rss_before,
    }
    if sections:
        out["sections"] = secs
        out["sections_thread_cpu"] = thread_cpu
    if prof:
        import io
        import pstats

        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(20)
        out["profile"] = s.getvalue()
    return out


class _StubExecutor:
    """Serves each shard's lines as the OpenAI executor's ``fetch`` does (1 MiB chunks, 16 MB blocks, the size
    known from the content-length, so a small file is cut into one block per parse worker)."""

    name = "openai_batch"
    pricing = "batch"
    poll_interval_s = 1.0
    max_requests_per_batch = 50_000
    max_bytes_per_batch = 200 * 2**20

    def __init__(self, by_batch: dict[str, bytes]):
        from batch_pipeline.core.run.threads import default_workers

        self.by_batch = by_batch
        self.parse_workers = default_workers()  # once, as BatchBackend does (it reads the cgroup's CPU quota)

    def fetch(self, handle):
        from batch_pipeline.executors.openai.format import parse_output_stream

        data = self.by_batch[handle.batch_id]
        chunks = (data[i : i + (1 << 20)] for i in range(0, len(data), 1 << 20))
        yield from parse_output_stream(chunks, self.parse_workers, total_bytes=len(data))

    def submit(self, work):
        raise NotImplementedError

    def poll(self, handle):
        raise NotImplementedError

    def cancel(self, handle):
        raise NotImplementedError

    def find(self, key):
        return None


def ours_runner(files: list[str], work: str, shard_lines: int = SHARD, at_once: int | None = None) -> dict:
    from concurrent.futures import ThreadPoolExecutor

    from batch_pipeline.core.ledger.attempts import Attempt, IntentRecord
    from batch_pipeline.core.ledger.executor import BatchHandle
    from batch_pipeline.core.run.runner import ShardRunner
    from batch_pipeline.core.run.threads import ordered_map
    from batch_pipeline.core.settings import COLLECT_SHARDS_AT_ONCE

    at_once = at_once or COLLECT_SHARDS_AT_ONCE
    spec, _plan, price, store = _setup_ours(work)
    # setup (untimed): group the lines into shards of shard_lines by their position, output file first
    lines: list[bytes] = []
    for p in files:
        with open(p, "rb") as f:
            lines.extend(f.readlines())
    by_batch: dict[str, bytes] = {}
    attempts = []
    for s in range(0, len(lines), shard_lines):
        sid = f"s{s // shard_lines + 1:05d}"
        chunk = lines[s : s + shard_lines]
        rids = [ln[ln.index(b'"custom_id": "') + 14 :][:64].decode() for ln in chunk]
        by_batch[f"batch_{sid}"] = b"".join(chunk)
        attempts.append(
            (
                Attempt(1, {"intent": IntentRecord(key=f"{JOB}:{sid}:1", request_ids=rids)}),
                BatchHandle("openai_batch", f"batch_{sid}", f"{JOB}:{sid}:1"),
            )
        )
    n_lines = len(lines)
    del lines
    runner = ShardRunner(spec, store, _StubExecutor(by_batch), price)
    rss_before = maxrss_mb()
    cpu0 = cpu_s()
    started = time.perf_counter()
    rows = ok = 0
    # as ShardDriver.collect_phases: at_once shards on a pool of their own, the outcomes taken in shard order
    with ThreadPoolExecutor(at_once, thread_name_prefix="collect") as pool:
        for r, k, _systemic in ordered_map(lambda a: runner._ingest(*a), attempts, at_once, ahead=at_once, pool=pool):
            rows += r
            ok += k
    seconds = time.perf_counter() - started
    return {
        "variant": "ours_runner" if at_once > 1 else "ours_runner_serial",
        "seconds": seconds,
        "cpu_s": cpu_s() - cpu0,
        "lines": n_lines,
        "rows": rows,
        "succeeded": ok,
        "shards": len(attempts),
        "peak_rss_mb": maxrss_mb(),
        "rss_after_imports_mb": rss_before,
    }


# -- breakdown: the steps one by one, and the alternatives measured for them ---------------------------------
def breakdown(files: list[str], reps: int = 3) -> dict:
    import io

    import polars as pl
    import pyarrow as pa
    import pyarrow.json as pajson
    import pyarrow.parquet as pq

    from batch_pipeline.core.ledger.executor import ShardWork
    from batch_pipeline.core.ledger.result_parts import PART_OPTIONS
    from batch_pipeline.core.quality.validate import validate
    from batch_pipeline.core.run.results import build_results
    from batch_pipeline.executors.jsonl_blocks import iter_blocks, lines_array
    from batch_pipeline.executors.openai.format import OUTPUT_LINE_SCHEMA, _parse_lines, parse_output_block

    data = b"".join(Path(p).read_bytes() for p in files)
    n = data.count(b"\n")
    out: dict[str, float] = {}

    def best(label, fn, lines=n, times=reps):
        secs, cpus = [], []
        value = None
        for _ in range(times):
            t, c = time.perf_counter(), cpu_s()
            value = fn()
            secs.append(time.perf_counter() - t)
            cpus.append(cpu_s() - c)
        out[label] = min(secs) / lines * 1e6
        out[f"cpu: {label}"] = min(cpus) / lines * 1e6
        print(f"    {out[label]:6.2f} s ({min(cpus) / lines * 1e6:5.2f} CPU s) per 1M lines  {label}", flush=True)
        return value

    print(f"  breakdown (wall and process CPU seconds per 1M lines, best of {reps}):")
    chunks = [data[i : i + (1 << 20)] for i in range(0, len(data), 1 << 20)]
    blocks = best("iter_blocks over 1 MiB chunks", lambda: list(iter_blocks(iter(chunks))))
    raws = best(
        "parse_output_block (core: DuckDB json_extract_string + lines from the block buffer)",
        lambda: [parse_output_block(b) for b in blocks],
    )
    best(
        "  of which the lines array (numpy newlines, one copy without them; DuckDB checks UTF-8)",
        lambda: [lines_array(b) for b in blocks],
    )
    old = best(
        "alt: the per-line path (split/strip/join, Arrow's JSON reader, decode per line)",
        lambda: [_parse_lines(b) for b in blocks],
        times=1,
    )
    same = all(a.equals(b) for a, b in zip(raws, old))
    print(f"           identical tables: {same}")
    out["parse_identical_to_per_line_path"] = same
    opts = pajson.ParseOptions(explicit_schema=OUTPUT_LINE_SCHEMA, unexpected_field_behavior="ignore")
    best(
        "alt: pajson.read_json(OUTPUT_LINE_SCHEMA) alone",
        lambda: [pajson.read_json(io.BytesIO(b), parse_options=opts) for b in blocks],
    )
    schema = pl.from_arrow(pa.Table.from_batches([], schema=OUTPUT_LINE_SCHEMA)).schema
    first = blocks[:2]
    best(
        "alt: pl.read_ndjson(nested schema) alone (2 blocks)",
        lambda: [pl.read_ndjson(b, schema=schema) for b in first],
        lines=sum(b.count(b"\n") for b in first),
        times=1,
    )
    scratch = tempfile.mkdtemp(prefix="ingest_bd-")
    spec, plan, price, _ = _setup_ours(scratch)
    shutil.rmtree(scratch, ignore_errors=True)
    best(
        "validate (core: column-wise, Python only for unsettled and error rows)",
        lambda: [validate(r, spec.output) for r in raws],
    )
    work = ShardWork(JOB, "s00001", 1, "k", plan, pa.table({"request_id": pa.array([], pa.string())}))
    tables = best(
        "build_results (includes validate)",
        lambda: [
            build_results(
                r,
                work,
                backend="openai_batch",
                pricing="batch",
                prompt_version="v1",
                price=price,
                provider_batch_id="b",
            )
            for r in raws
        ],
    )
    for kw in (
        PART_OPTIONS,
        {"compression": "zstd"},
        {"compression": "zstd", "compression_level": -1},
        {"compression": "snappy"},
        {"compression": "lz4"},
        {"compression": "none"},
    ):
        sizes: list[int] = []

        def write(kw=kw, sizes=sizes):
            sizes.clear()
            for t in tables:
                buf = pa.BufferOutputStream()
                pq.write_table(t, buf, **kw)
                sizes.append(buf.getvalue().size)

        label = (
            "pq.write_table PART_OPTIONS (core: raw_payload LZ4, the rest zstd; no dictionary or statistics for "
            "the all-distinct columns)"
            if kw is PART_OPTIONS
            else "pq.write_table " + ", ".join(f"{k}={v}" for k, v in kw.items())
        )
        best(label, write)
        out[f"MiB per 1M lines: {label}"] = sum(sizes) / n * 1e6 / 2**20
        print(f"           {sum(sizes) / n * 1e6 / 2**20:,.0f} MiB per 1M lines")
    return out


# -- driver -------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, default=500_000)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--sections", action="store_true", help="time the steps of our path")
    ap.add_argument("--profile", action="store_true", help="cProfile our path (slows Python code)")
    ap.add_argument("--only", choices=list(VARIANTS), action="append")
    ap.add_argument("--repeat", type=int, default=5, help="runs of each variant, interleaved (best and median)")
    ap.add_argument(
        "--shard-lines",
        type=int,
        default=SHARD,
        help="lines per shard for ours_runner (default 5,000; OpenAI allows up to 50,000 per batch)",
    )
    ap.add_argument(
        "--breakdown",
        action="store_true",
        help="time the steps of parse_output_block/validate/write and candidate replacements",
    )
    args = ap.parse_args(argv)
    t = time.perf_counter()
    meta = generate(args.lines, args.seed)
    out_path, err_path, _ = paths_for(args.lines, args.seed)
    files = [str(out_path), str(err_path)]
    print(
        f"ingest: {args.lines:,} lines, {meta['bytes'] / 2**20:,.0f} MiB ({time.perf_counter() - t:.1f}s to "
        f"generate/load); mix {', '.join(f'{k} {meta[k]:,}' for k in MIX_KEYS)}",
        flush=True,
    )
    for p in files:  # warm the page cache
        with open(p, "rb") as f:
            while f.read(64 * 2**20):
                pass
    variants = args.only or list(VARIANTS)
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    work = tempfile.mkdtemp(prefix="ingest_bench-")
    try:
        for rep in range(args.repeat):
            for v in variants:
                d = Path(work) / f"{v}-{rep}"
                d.mkdir()
                if v == "reference":
                    r = run_in_child("benchmarks.ingest_bench:reference", files, str(d))
                elif v == "ours":
                    r = run_in_child("benchmarks.ingest_bench:ours", files, str(d), args.sections, args.profile)
                else:
                    r = run_in_child(
                        "benchmarks.ingest_bench:ours_runner",
                        files,
                        str(d),
                        args.shard_lines,
                        1 if v == "ours_runner_serial" else None,
                    )
                r["lines_per_s"] = r["lines"] / r["seconds"]
                r["load"] = load()
                runs[v].append(r)
                print(
                    f"  {v:17s} {r['lines']:>9,} lines  {r['seconds']:6.2f} s (cpu {r['cpu_s']:.2f} s)  "
                    f"{r['lines_per_s']:>10,.0f} lines/s  load {r['load']:.1f}  "
                    f"peak RSS {r['peak_rss_mb']:6,.0f} MB (after setup {r['rss_after_imports_mb']:,.0f} MB)"
                    + (f"  succeeded {r['succeeded']:,}" if "succeeded" in r else ""),
                    flush=True,
                )
                shutil.rmtree(d, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    res: dict[str, dict] = {}
    for v, rs in runs.items():
        rates = sorted(r["lines_per_s"] for r in rs)
        best = max(rs, key=lambda r: r["lines_per_s"])
        res[v] = {
            **best,
            "best_lines_per_s": rates[-1],
            "median_lines_per_s": statistics.median(rates),
            "all_lines_per_s": [r["lines_per_s"] for r in rs],
            "loads": [r["load"] for r in rs],
        }
    checks = []
    for v, rs in runs.items():
        checks.append((f"{v}: rows == lines ({args.lines:,}) in every run", all(r["rows"] == args.lines for r in rs)))
        if "succeeded" in rs[0]:
            checks.append(
                (
                    f"{v}: succeeded == generated good labels ({meta['ok']:,}) in every run",
                    all(r["succeeded"] == meta["ok"] for r in rs),
                )
            )
    print(f"  best / median of {args.repeat} (lines/s), ratio to the reference's best / median:")
    for v, r in res.items():
        ratio = ""
        if "reference" in res and v != "reference":
            r["ratio_best"] = r["best_lines_per_s"] / res["reference"]["best_lines_per_s"]
            r["ratio_median"] = r["median_lines_per_s"] / res["reference"]["median_lines_per_s"]
            ratio = f"  ratio {r['ratio_best']:.2f}x / {r['ratio_median']:.2f}x"
        print(f"    {v:17s} {r['best_lines_per_s']:>10,.0f} / {r['median_lines_per_s']:>10,.0f}{ratio}")
    for v, target in (("ours", 400_000), ("ours_runner", 300_000), ("ours_runner_serial", 300_000)):
        if v in res:
            checks.append((f"{v} >= {target // 1000}k lines/s (best)", res[v]["best_lines_per_s"] >= target))
    for name, ok in checks:
        print(f"  [{'ok' if ok else 'MISS'}] {name}")
    if args.sections and "ours" in res:
        total = res["ours"]["seconds"]
        tcpu = res["ours"]["sections_thread_cpu"]
        print(
            f"  ours, time by step (of {total:.2f} s wall, {res['ours']['cpu_s']:.2f} s CPU in all threads; "
            "thread CPU = the calling thread's own, [writer] runs beside the main thread):"
        )
        for name, s in sorted(res["ours"]["sections"].items(), key=lambda kv: -kv[1]):
            print(f"    {s:7.3f} s {100 * s / total:5.1f}%  thread CPU {tcpu[name]:6.3f} s  {name}")
    if args.profile and "ours" in res:
        print(res["ours"]["profile"])
    bd = breakdown(files) if args.breakdown else None
    OUT.mkdir(exist_ok=True)
    (OUT / f"ingest_bench-{args.lines}.json").write_text(
        json.dumps(
            {
                "date": date.today().isoformat(),
                "load_at_end": load(),
                "meta": meta,
                "results": res,
                "checks": dict(checks),
                "breakdown_s_per_1m_lines": bd,
            },
            indent=1,
            default=str,
        )
    )
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
