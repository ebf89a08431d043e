"""Results ingestion throughput: OpenAI batch output JSONL -> validated result rows in the store.

Input (generated once, cached under ``benchmarks/out/``): an output file and an error file of an OpenAI
batch, ``--lines`` lines in all, in the format of ``/work/shared/PROVIDER_PROTOCOLS.md`` (and of the
sandbox): chat-completion bodies whose content is ``{"label":"..."}`` with usage; ~97% good labels,
0.5% truncated (``finish_reason: length``), 0.5% labels outside the set, and in the error file 1% HTTP
500 ``server_error``, 0.5% HTTP 400 ``context_length_exceeded``, 0.5% ``batch_expired`` lines.

Variants, each in its own spawned process (peak RSS per variant), timed in one script run:
- reference: plain Python, ``json.loads`` per line, pick the ``RAW_RESULT_SCHEMA`` fields, append to
  lists, write one Parquet file (zstd). No validation, no cost.
- ours: the executor's path, the files read in 1 MiB chunks -> ``iter_blocks`` (8 MB) ->
  ``parse_output_block`` -> ``build_results`` (validation against a ``choice`` output, cost, provenance)
  -> ``Store.write_table`` per block.
- ours, runner: ``ShardRunner._ingest`` (adds the ``is_in`` filter against the attempt's IDs and the
  Python counting) over shards of 5,000 lines, with a stub executor serving each shard's lines.

Target: ours >= 400k lines/s.

``--breakdown`` times the steps of parse_output_block / validate / the write, and candidate replacements
(``validate_vectorised``, ``iter_blocks_joined``, raw_payload from the block buffer) checked against core.

    python benchmarks/ingest_bench.py [--lines 500000] [--sections] [--breakdown] [--profile]
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

JOB = "ingest_bench"
LABELS = ["billing", "bug", "feature_request", "account", "other"]
SHARD = 5000
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
PRICE = {"input_per_mtok": 0.15, "cached_input_per_mtok": 0.075, "output_per_mtok": 0.6, "batch_discount": 0.5,
         "checked": "2026-01-01"}


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
            b = raw[i * 64:(i + 1) * 64].hex()
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
                    f'"default", "system_fingerprint": "fp_b376dfbbd5"}}}}, "error": null}}\n')
            elif k < 0.995:
                if k < 0.99:
                    status, msg, typ, code = 500, "The server had an error processing your request.", "server_error", \
                        "server_error"
                    counts["http_500"] += 1
                else:
                    status, msg, typ, code = 400, ("This model's maximum context length is 128000 tokens. However, "
                                                   "your messages resulted in 131072 tokens."), \
                        "invalid_request_error", "context_length_exceeded"
                    counts["http_400"] += 1
                be.append(f'{head}"response": {{"status_code": {status}, "request_id": "req_{req_id}", "body": '
                          f'{{"error": {{"message": "{msg}", "type": "{typ}", "param": null, "code": "{code}"}}}}}}, '
                          f'"error": null}}\n')
            else:
                be.append(f'{head}"response": null, "error": {{"code": "batch_expired", "message": "This request '
                          f'could not be executed before the completion window expired."}}}}\n')
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
    meta = {"lines": lines, "seed": seed, **counts, "bytes": out_path.stat().st_size + err_path.stat().st_size,
            "seconds": round(time.perf_counter() - started, 2)}
    meta_path.write_text(json.dumps(meta, indent=1))
    return meta


def request_ids_of(files: list[str]) -> list[str]:
    """custom_id of every line (setup only: the attempt's request IDs)."""
    out = []
    for p in files:
        with open(p, "rb") as f:
            for line in f:
                i = line.index(b'"custom_id": "') + 14
                out.append(line[i:i + 64].decode())
    return out


# -- variants (spawned children) --------------------------------------------------------------------
def reference(files: list[str], out_dir: str) -> dict:
    import json as _json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from batch_pipeline.core.executor import RAW_RESULT_SCHEMA

    rss_before = maxrss_mb()
    cpu0 = cpu_s()
    started = time.perf_counter()
    cols: dict[str, list] = {name: [] for name in RAW_RESULT_SCHEMA.names}
    (rid, http, text, finish, in_tok, cached, out_tok, code, message, preq, raw) = (
        cols[n].append for n in RAW_RESULT_SCHEMA.names)
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
    return {"variant": "reference", "seconds": seconds, "cpu_s": cpu_s() - cpu0, "lines": lines,
            "rows": table.num_rows, "peak_rss_mb": maxrss_mb(), "rss_after_imports_mb": rss_before}


def _setup_ours(work: str):
    from batch_pipeline.core.cost import Price
    from batch_pipeline.core.executor import RequestPlan
    from batch_pipeline.core.spec import parse_spec
    from batch_pipeline.core.store import Store

    spec = parse_spec(SPEC_YAML)
    return spec, RequestPlan.from_spec(spec), Price.model_validate(PRICE), Store(Path(work) / "store")


def ours(files: list[str], work: str, sections: bool, profile: bool) -> dict:
    import uuid

    import pyarrow as pa
    import pyarrow.compute as pc

    from batch_pipeline.core import results as results_mod
    from batch_pipeline.core import validate as validate_mod
    from batch_pipeline.core.executor import ShardWork
    from batch_pipeline.core.paths import JobPaths
    from batch_pipeline.core.results import build_results
    from batch_pipeline.executors.openai_format import iter_blocks, parse_output_block

    spec, plan, price, store = _setup_ours(work)
    ids = request_ids_of(files)
    work_ = ShardWork(JOB, "s00001", 1, f"{JOB}:s00001:1", plan, pa.table({"request_id": ids}))
    paths = JobPaths(JOB)
    secs: dict[str, float] = {}
    if sections:  # time validate() inside build_results too
        inner = validate_mod.validate

        def timed_validate(*a, **kw):
            t0 = time.perf_counter()
            try:
                return inner(*a, **kw)
            finally:
                secs["  of which validate()"] = secs.get("  of which validate()", 0.0) + time.perf_counter() - t0
        results_mod.validate = timed_validate

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

    def tick(name: str, since: float) -> float:
        now = time.perf_counter()
        secs[name] = secs.get(name, 0.0) + now - since
        return now

    for path in files:
        with open(path, "rb") as f:
            blocks = iter_blocks(iter(lambda: f.read(1 << 20), b""))
            t = time.perf_counter()
            for block in blocks:
                t = tick("read 1 MiB chunks + iter_blocks", t)
                raw = parse_output_block(block)
                t = tick("parse_output_block", t)
                table = build_results(raw, work_, backend="openai_batch", pricing="batch", prompt_version="v1",
                                      price=price, provider_batch_id="batch_bench")
                t = tick("build_results", t)
                flush += 1
                store.write_table(paths.result_part("s00001", 1, flush, uuid.uuid4().hex[:8]), table)
                t = tick("Store.write_table (zstd Parquet)", t)
                lines += raw.num_rows
                rows += table.num_rows
                succeeded += pc.sum(pc.equal(table.column("status"), "succeeded")).as_py() or 0
                t = tick("bench bookkeeping", t)
    if prof:
        prof.disable()
    seconds = time.perf_counter() - started
    out = {"variant": "ours", "seconds": seconds, "cpu_s": cpu_s() - cpu0, "lines": lines, "rows": rows,
           "succeeded": succeeded,
           "blocks": flush, "peak_rss_mb": maxrss_mb(), "rss_after_imports_mb": rss_before}
    if sections:
        out["sections"] = secs
    if prof:
        import io
        import pstats

        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(20)
        out["profile"] = s.getvalue()
    return out


class _StubExecutor:
    """Serves each shard's lines as the OpenAI executor's ``fetch`` would (1 MiB chunks, 8 MB blocks)."""

    name = "openai_batch"
    pricing = "batch"
    poll_interval_s = 1.0
    max_requests_per_batch = 50_000
    max_bytes_per_batch = 200 * 2**20

    def __init__(self, by_batch: dict[str, bytes]):
        self.by_batch = by_batch

    def fetch(self, handle):
        from batch_pipeline.executors.openai_format import iter_blocks, parse_output_block

        data = self.by_batch[handle.batch_id]
        chunks = (data[i:i + (1 << 20)] for i in range(0, len(data), 1 << 20))
        for block in iter_blocks(chunks):
            yield parse_output_block(block)

    def submit(self, work):
        raise NotImplementedError

    def poll(self, handle):
        raise NotImplementedError

    def cancel(self, handle):
        raise NotImplementedError

    def find(self, key):
        return None


def ours_runner(files: list[str], work: str) -> dict:
    from batch_pipeline.core.attempts import Attempt
    from batch_pipeline.core.executor import BatchHandle
    from batch_pipeline.core.runner import ShardRunner

    spec, _plan, price, store = _setup_ours(work)
    # setup (untimed): group the lines into shards of SHARD by their position, output file first
    lines: list[bytes] = []
    for p in files:
        with open(p, "rb") as f:
            lines.extend(f.readlines())
    by_batch: dict[str, bytes] = {}
    attempts = []
    for s in range(0, len(lines), SHARD):
        sid = f"s{s // SHARD + 1:05d}"
        chunk = lines[s:s + SHARD]
        rids = [ln[ln.index(b'"custom_id": "') + 14:][:64].decode() for ln in chunk]
        by_batch[f"batch_{sid}"] = b"".join(chunk)
        attempts.append((Attempt(1, {"intent": {"key": f"{JOB}:{sid}:1", "request_ids": rids}}),
                         BatchHandle("openai_batch", f"batch_{sid}", f"{JOB}:{sid}:1")))
    n_lines = len(lines)
    del lines
    runner = ShardRunner(spec, store, _StubExecutor(by_batch), price)
    rss_before = maxrss_mb()
    cpu0 = cpu_s()
    started = time.perf_counter()
    rows = ok = 0
    for attempt, handle in attempts:
        r, k = runner._ingest(attempt, handle)
        rows += r
        ok += k
    seconds = time.perf_counter() - started
    return {"variant": "ours_runner", "seconds": seconds, "cpu_s": cpu_s() - cpu0, "lines": n_lines, "rows": rows,
            "succeeded": ok,
            "shards": len(attempts), "peak_rss_mb": maxrss_mb(), "rss_after_imports_mb": rss_before}


# -- breakdown: replicas of the core steps and candidate replacements ---------------------------------
LABEL_RE = r'^\{\s*"label"\s*:\s*"(?P<label>[^"\\]*)"\s*\}$'


def validate_vectorised(raw, output):
    """Candidate for ``validate`` with a ``choice`` output: column-wise for the common rows (bare label or
    ``{"label": "..."}``), the core's per-row Python only for the rest (errors, odd JSON). Same verdicts."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from batch_pipeline.core.errors import classify_line_error
    from batch_pipeline.core.validate import Verdicts, _parse_choice

    labels = output.choice or []
    n = raw.num_rows
    s = pa.string()
    http = raw.column("http_status").combine_chunks()
    finish = raw.column("finish_reason").combine_chunks()
    texts = raw.column("output_text").combine_chunks()
    answered = pc.fill_null(pc.equal(http, 200), False)
    truncated = pc.and_(answered, pc.fill_null(pc.equal(finish, "length"), False))
    stripped = pc.utf8_trim_whitespace(texts)
    label_set = pa.array(labels, s)
    bare = pc.fill_null(pc.is_in(stripped, value_set=label_set), False)
    lab = pc.struct_field(pc.extract_regex(stripped, LABEL_RE), "label")
    in_json = pc.fill_null(pc.is_in(lab, value_set=label_set), False)
    live = pc.and_(answered, pc.invert(truncated))
    ok_fast = pc.and_(live, pc.or_(bare, in_json))
    value = pc.if_else(ok_fast, pc.if_else(bare, stripped, lab), pa.nulls(n, s))
    status = pc.if_else(ok_fast, "succeeded", pc.if_else(answered, "invalid", "errored")).cast(s)
    eclass = pc.if_else(ok_fast, pa.nulls(n, s), pc.if_else(answered, "invalid_output", pa.nulls(n, s))).cast(s)
    ecode = pc.if_else(truncated, "truncated", pc.if_else(pc.and_(live, pc.invert(ok_fast)), "contract_violation",
                                                          pa.nulls(n, s))).cast(s)
    emsg = pc.if_else(truncated, "output hit max_tokens (finish_reason=length)", pa.nulls(n, s)).cast(s)
    # the per-row Python path, only for rows the columns could not settle
    slow = np.flatnonzero(pc.and_(live, pc.invert(ok_fast)).to_numpy(zero_copy_only=False))
    if len(slow):
        parsed = _parse_choice(texts.take(pa.array(slow)).to_pylist(), set(labels))
        good = np.array([err is None for _, err in parsed])
        mask = np.zeros(n, bool)
        mask[slow] = True
        status = pc.replace_with_mask(status, pa.array(mask), pa.array(
            ["succeeded" if g else "invalid" for g in good], s))
        value = pc.replace_with_mask(value, pa.array(mask), pa.array([v for v, _ in parsed], s))
        eclass = pc.replace_with_mask(eclass, pa.array(mask), pa.array(
            [None if g else "invalid_output" for g in good], s))
        ecode = pc.replace_with_mask(ecode, pa.array(mask), pa.array(
            [None if g else "contract_violation" for g in good], s))
        emsg = pc.replace_with_mask(emsg, pa.array(mask), pa.array([e for _, e in parsed], s))
    err_rows = np.flatnonzero(pc.invert(answered).to_numpy(zero_copy_only=False))
    if len(err_rows):
        idx = pa.array(err_rows)
        mask = np.zeros(n, bool)
        mask[err_rows] = True
        hs = raw.column("http_status").take(idx).to_pylist()
        cs = raw.column("error_code").take(idx).to_pylist()
        ms = raw.column("error_message").take(idx).to_pylist()
        m = pa.array(mask)
        eclass = pc.replace_with_mask(eclass, m, pa.array([classify_line_error(c, h).value for c, h in zip(cs, hs)], s))
        ecode = pc.replace_with_mask(ecode, m, pa.array(
            [c or (f"http_{h}" if h else "no_response") for c, h in zip(cs, hs)], s))
        emsg = pc.replace_with_mask(emsg, m, pa.array([x or "no response for this request" for x in ms], s))
    return Verdicts(status, value, eclass, ecode, emsg)


def _raw_payload_from_buffer(block: bytes):
    """Candidate for the raw_payload column: one Arrow array over the block's bytes (newline offsets from
    numpy), instead of a Python ``decode`` per line. Valid only when the block has no blank lines."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    nl = np.flatnonzero(np.frombuffer(block, np.uint8) == 10)
    offsets = np.concatenate(([0], nl + 1)).astype(np.int64)
    arr = pa.LargeStringArray.from_buffers(len(nl), pa.py_buffer(offsets), pa.py_buffer(block))
    arr.validate(full=True)  # UTF-8 check; the core would fall back to the per-line path on failure
    return pc.utf8_rtrim(arr, characters="\n").cast(pa.string())


def iter_blocks_joined(chunks, block_bytes: int = 8 * 2**20):
    """Candidate for ``iter_blocks``: collect chunks in a list and join once (``carry += chunk`` recopies
    the growing carry for every 1 MiB chunk)."""
    parts: list[bytes] = []
    size = 0
    for chunk in chunks:
        parts.append(chunk)
        size += len(chunk)
        if size < block_bytes:
            continue
        buf = b"".join(parts)
        cut = buf.rfind(b"\n")
        if cut < 0:
            parts, size = [buf], len(buf)
            continue
        yield buf[: cut + 1]
        parts = [buf[cut + 1:]]
        size = len(parts[0])
    buf = b"".join(parts)
    if buf.strip():
        yield buf


def breakdown(files: list[str], reps: int = 3) -> dict:
    import io

    import pyarrow as pa
    import pyarrow.json as pajson
    import pyarrow.parquet as pq

    from batch_pipeline.core.executor import ShardWork
    from batch_pipeline.core.results import build_results
    from batch_pipeline.core.validate import validate
    from batch_pipeline.executors.openai_format import OUTPUT_LINE_SCHEMA, iter_blocks, parse_output_block

    data = b"".join(Path(p).read_bytes() for p in files)
    n = data.count(b"\n")
    out: dict[str, float] = {}

    def best(label, fn):
        secs = []
        value = None
        for _ in range(reps):
            t = time.perf_counter()
            value = fn()
            secs.append(time.perf_counter() - t)
        out[label] = min(secs) / n * 1e6
        print(f"    {out[label]:6.2f} s per 1M lines  {label}", flush=True)
        return value

    print("  breakdown (seconds per 1M lines, best of %d; replicas of core steps, 'alt' = candidate):" % reps)
    chunks = [data[i:i + (1 << 20)] for i in range(0, len(data), 1 << 20)]
    blocks = best("iter_blocks over 1 MiB chunks (core: carry += chunk)", lambda: list(iter_blocks(iter(chunks))))
    alt_blocks = best("alt: iter_blocks collecting chunks in a list, one join",
                      lambda: list(iter_blocks_joined(iter(chunks))))
    assert alt_blocks == blocks
    raws = best("parse_output_block (core)", lambda: [parse_output_block(b) for b in blocks])
    best("  of which split lines + strip filter + join (Python)",
         lambda: [b"\n".join([ln for ln in b.split(b"\n") if ln.strip()]) for b in blocks])
    opts = pajson.ParseOptions(explicit_schema=OUTPUT_LINE_SCHEMA, unexpected_field_behavior="ignore")
    best("  of which pajson.read_json(OUTPUT_LINE_SCHEMA)",
         lambda: [pajson.read_json(io.BytesIO(b), parse_options=opts) for b in blocks])
    best("  of which raw_payload: pa.array([line.decode() for line in lines])",
         lambda: [pa.array([ln.decode("utf-8", "replace") for ln in b.split(b"\n") if ln.strip()], pa.string())
                  for b in blocks])
    alt_raw = best("alt: raw_payload as one Arrow array over the block buffer",
                   lambda: [_raw_payload_from_buffer(b) for b in blocks])
    assert all(a.equals(r.column("raw_payload").combine_chunks()) for a, r in zip(alt_raw, raws))
    scratch = tempfile.mkdtemp(prefix="ingest_bd-")
    spec, plan, price, _ = _setup_ours(scratch)
    shutil.rmtree(scratch, ignore_errors=True)
    core_v = best("validate (core: to_pylist x4, json.loads per row, per-row loop)",
                  lambda: [validate(r, spec.output) for r in raws])
    alt_v = best("alt: validate_vectorised (columns + Python only for unsettled rows)",
                 lambda: [validate_vectorised(r, spec.output) for r in raws])
    same = all(all(getattr(a, f).equals(getattr(b, f)) for f in ("status", "parsed_output", "error_class",
                                                                 "error_code", "error_message"))
               for a, b in zip(core_v, alt_v))
    print(f"           validate_vectorised verdicts identical to core: {same}")
    out["validate_vectorised_identical"] = same
    work = ShardWork(JOB, "s00001", 1, "k", plan, pa.table({"request_id": pa.array([], pa.string())}))
    tables = best("build_results (core, includes validate)",
                  lambda: [build_results(r, work, backend="openai_batch", pricing="batch", prompt_version="v1",
                                         price=price, provider_batch_id="b") for r in raws])

    def write(**kw):
        return lambda: [pq.write_table(t, io.BytesIO(), **kw) for t in tables]

    best("Store.write_table equivalent: pq.write_table(zstd) (core)", write(compression="zstd"))
    low = ["shard_id", "attempt", "backend", "pricing", "model", "prompt_version", "status", "parsed_output",
           "finish_reason", "error_class", "error_code", "provider_batch_id"]
    best("alt: zstd, dictionary only for low-cardinality columns", write(compression="zstd", use_dictionary=low))
    best("isolate: no compression (what zstd of ~850-byte raw_payload lines costs)", write(compression="none"))
    return out


# -- driver -------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, default=500_000)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--sections", action="store_true", help="time the steps of our path")
    ap.add_argument("--profile", action="store_true", help="cProfile our path (slows Python code)")
    ap.add_argument("--only", choices=["reference", "ours", "ours_runner"], action="append")
    ap.add_argument("--breakdown", action="store_true",
                    help="time the steps of parse_output_block/validate/write and candidate replacements")
    args = ap.parse_args(argv)
    t = time.perf_counter()
    meta = generate(args.lines, args.seed)
    out_path, err_path, _ = paths_for(args.lines, args.seed)
    files = [str(out_path), str(err_path)]
    print(f"ingest: {args.lines:,} lines, {meta['bytes'] / 2**20:,.0f} MiB ({time.perf_counter() - t:.1f}s to "
          f"generate/load); mix {', '.join(f'{k} {meta[k]:,}' for k in MIX_KEYS)}",
          flush=True)
    for p in files:  # warm the page cache
        with open(p, "rb") as f:
            while f.read(64 * 2**20):
                pass
    variants = args.only or ["reference", "ours", "ours_runner"]
    res: dict[str, dict] = {}
    work = tempfile.mkdtemp(prefix="ingest_bench-")
    try:
        for v in variants:
            d = Path(work) / v
            d.mkdir()
            if v == "reference":
                r = run_in_child("benchmarks.ingest_bench:reference", files, str(d))
            elif v == "ours":
                r = run_in_child("benchmarks.ingest_bench:ours", files, str(d), args.sections, args.profile)
            else:
                r = run_in_child("benchmarks.ingest_bench:ours_runner", files, str(d))
            r["lines_per_s"] = r["lines"] / r["seconds"]
            res[v] = r
            print(f"  {v:12s} {r['lines']:>9,} lines  {r['seconds']:6.2f} s (cpu {r['cpu_s']:.2f} s)  "
                  f"{r['lines_per_s']:>10,.0f} lines/s  load {load():.1f}  "
                  f"peak RSS {r['peak_rss_mb']:6,.0f} MB (after setup {r['rss_after_imports_mb']:,.0f} MB)"
                  + (f"  succeeded {r['succeeded']:,}" if "succeeded" in r else ""), flush=True)
            shutil.rmtree(d, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    checks = []
    for v, r in res.items():
        checks.append((f"{v}: rows == lines ({args.lines:,})", r["rows"] == args.lines))
        if "succeeded" in r:
            checks.append((f"{v}: succeeded == generated good labels ({meta['ok']:,})", r["succeeded"] == meta["ok"]))
    if "reference" in res:
        for v in ("ours", "ours_runner"):
            if v in res:
                res[v]["ratio"] = res["reference"]["seconds"] / res[v]["seconds"]
                print(f"  ratio {v}/reference: {res[v]['ratio']:.2f}x")
    if "ours" in res:
        checks.append(("ours >= 400k lines/s", res["ours"]["lines_per_s"] >= 400_000))
    for name, ok in checks:
        print(f"  [{'ok' if ok else 'MISS'}] {name}")
    if args.sections and "ours" in res:
        total = res["ours"]["seconds"]
        print(f"  ours, time by step (of {total:.2f} s):")
        for name, s in sorted(res["ours"]["sections"].items(), key=lambda kv: -kv[1]):
            print(f"    {s:7.3f} s {100 * s / total:5.1f}%  {name}")
    if args.profile and "ours" in res:
        print(res["ours"]["profile"])
    bd = breakdown(files) if args.breakdown else None
    OUT.mkdir(exist_ok=True)
    (OUT / f"ingest_bench-{args.lines}.json").write_text(json.dumps(
        {"date": date.today().isoformat(), "load_at_end": load(), "meta": meta, "results": res, "checks": dict(checks),
         "breakdown_s_per_1m_lines": bd}, indent=1,
        default=str))
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
