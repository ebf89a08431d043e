"""The sandbox's own cost for an N-request OpenAI batch job: its peak RSS and CPU per request (issue 19).

The sandbox runs in a spawned child (an in-process ``SandboxServer``), so its figures are its own; this process
drives it through the real ``openai`` SDK: upload the input files (50,000 requests each, the API's cap), create the
batches, poll them to ``completed``, stream every output file down and count its lines. The child reports its peak
RSS (``VmHWM``) and the CPU seconds it spent from ready to done, divided by N.

``--old-root DIR`` runs the same job a second time against the sandbox of another checkout, in the same run:
``git archive COMMIT batch_pipeline | tar -x -C DIR`` (the commit before the spool: 231f840). ``--profile N``
prints the sandbox's N heaviest functions by own time (cProfile over every request it served). ``--in-progress-s S``
runs every batch's in_progress over S sandbox seconds (the scenario's default is 0.2 s: each batch is answered
whole in one poll), so all the batches are in progress at once, as a real job's are, and their answers so far add up. ``--state-dir``
gives the sandbox a temporary state directory (it saves ``state.json`` after every change, as a dry run that must
survive a restart does) and prints the last ``state.json``'s size.

Run: nice -n 19 python benchmarks/sandbox_bench.py --requests 100000 [--in-progress-s 60] [--old-root /tmp/old]
     [--profile 25] [--long]
``--long``: the tickets are 300-1,500 character slices of ``make_rows``' word pool (what ``e2e_bench`` sends),
where counting the prompts' tokens is most of the sandbox's CPU.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import openai

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from benchmarks._harness import cpu_s, load, maxrss_mb  # noqa: E402

PER_BATCH = 50_000
MODEL = "gpt-4o-mini"
TERMINAL = ("completed", "failed", "expired", "cancelled")


def long_texts() -> tuple[str, int, int]:
    """``make_rows``' word pool (seed 1) and its body lengths: the prompts ``e2e_bench`` sends."""
    import random

    from benchmarks.make_rows import MAX_BODY, MIN_BODY, _pool

    return _pool(random.Random(1)), MIN_BODY, MAX_BODY


def batch_file(start: int, count: int, long: bool = False) -> bytes:
    """``count`` chat requests with a label schema, as the pipeline writes them (custom ids from ``start``);
    ``long``: each ticket a 300-1,500 character slice of ``make_rows``' word pool instead of one short sentence."""
    pool, lo, hi = long_texts() if long else ("", 0, 0)
    schema = {"type": "object", "properties": {"label": {"type": "string", "enum": ["billing", "bug", "other"]}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "label", "schema": schema, "strict": True}}
    lines = []
    for i in range(start, start + count):
        body = {
            "model": MODEL,
            "max_tokens": 32,
            "response_format": fmt,
            "messages": [
                {"role": "system", "content": "Label the ticket: billing, bug or other."},
                {"role": "user", "content": f"Ticket {i}: " + _slice(pool, i, lo, hi)}
                if long
                else {"role": "user", "content": f"Ticket {i}: my invoice was charged twice, please help"},
            ],
        }
        line = {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
        lines.append(json.dumps(line, separators=(",", ":")))
    return ("\n".join(lines) + "\n").encode()


def _slice(pool: str, i: int, lo: int, hi: int) -> str:
    """The i-th ticket: a deterministic slice of the pool, ``lo`` to ``hi`` characters long."""
    size = lo + (i * 7919) % (hi - lo)
    start = (i * 104_729) % (len(pool) - size)
    return pool[start : start + size]


def _profiled_handler(profiler: Any) -> None:
    """Wrap the HTTP handler's entry points so ``profiler`` sees every request, one at a time."""
    import threading

    from batch_pipeline.sandbox import http_server

    serial = threading.Lock()
    original = http_server._Handler._serve

    def serve(self: Any) -> None:
        with serial:
            profiler.enable()
            try:
                original(self)
            finally:
                profiler.disable()

    for name in ("_serve", "do_GET", "do_POST", "do_DELETE", "do_PUT", "do_PATCH"):
        setattr(http_server._Handler, name, serve)


def serve_sandbox(root: str | None, conn: Any, profile_top: int, persist: bool = False) -> None:
    """The child: a sandbox on a free port until told to stop; then its peak RSS, CPU and profile."""
    if root:
        sys.path.insert(0, root)
    import cProfile
    import io
    import pstats

    import batch_pipeline.sandbox as sandbox_pkg
    from batch_pipeline.sandbox import SandboxServer

    profiler = cProfile.Profile() if profile_top else None
    if profiler is not None:
        _profiled_handler(profiler)
    state_dir = tempfile.mkdtemp(prefix="sandbox-bench-state-") if persist else None
    server = SandboxServer(port=0, state_dir=state_dir).start()
    ready_cpu, ready_rss = cpu_s(), maxrss_mb()
    conn.send(server.url)
    conn.recv()  # the driver is done
    report = {"cpu_s": cpu_s() - ready_cpu, "peak_rss_mb": maxrss_mb(), "ready_rss_mb": ready_rss}
    report["code"] = sandbox_pkg.__file__
    if state_dir is not None:
        report["state_json_mb"] = (Path(state_dir) / "state.json").stat().st_size / 2**20
    if profiler is not None:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(profile_top)
        report["profile"] = text.getvalue()
    server.stop()
    if state_dir is not None:
        shutil.rmtree(state_dir, ignore_errors=True)
    conn.send(report)


def drive(url: str, requests: int, in_progress_s: float | None, long: bool = False) -> dict[str, float]:
    """Upload, create, poll to completed and stream every output down; the phases' wall seconds."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="sk-sandbox", max_retries=0, timeout=600)
    phases: dict[str, float] = {}
    t0 = time.perf_counter()
    ids = []
    for number, start in enumerate(range(0, requests, PER_BATCH)):
        data = batch_file(start, min(PER_BATCH, requests - start), long)
        ids.append(client.files.create(file=(f"in{number}.jsonl", data), purpose="batch").id)
    phases["upload_s"] = time.perf_counter() - t0
    metadata = None
    if in_progress_s is not None:
        metadata = {"sandbox_scenario": "normal", "sandbox_param_in_progress_s": str(in_progress_s)}
    batches = [
        client.batches.create(
            input_file_id=f, endpoint="/v1/chat/completions", completion_window="24h", metadata=metadata
        ).id
        for f in ids
    ]
    outputs = []
    for batch_id in batches:
        while (batch := client.batches.retrieve(batch_id)).status not in TERMINAL:
            time.sleep(0.05)
        assert batch.status == "completed" and batch.output_file_id, batch
        outputs.append(batch.output_file_id)
    phases["create_and_wait_s"] = time.perf_counter() - t0 - phases["upload_s"]
    t = time.perf_counter()
    lines = 0
    for file_id in outputs:
        with client.files.with_streaming_response.content(file_id) as response:
            lines += sum(chunk.count(b"\n") for chunk in response.iter_bytes(1 << 20))
    phases["download_s"] = time.perf_counter() - t
    phases["total_s"] = time.perf_counter() - t0
    assert lines == requests, (lines, requests)
    client.close()
    return phases


def measure(
    root: str | None,
    requests: int,
    profile_top: int,
    in_progress_s: float | None,
    persist: bool = False,
    long: bool = False,
) -> dict[str, Any]:
    """One job against the sandbox of ``root`` (None: this checkout) in its own spawned child."""
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=serve_sandbox, args=(root, theirs, profile_top, persist))
    child.start()
    url = ours.recv()
    phases = drive(url, requests, in_progress_s, long)
    ours.send("done")
    report = ours.recv()
    child.join(timeout=60)
    return {**phases, **report, "cpu_us_per_request": report["cpu_s"] / requests * 1e6}


def _print(label: str, result: dict[str, Any]) -> None:
    print(
        f"{label:<7} peak RSS {result['peak_rss_mb']:7.0f} MB (ready {result['ready_rss_mb']:.0f})  "
        f"CPU {result['cpu_s']:6.1f} s = {result['cpu_us_per_request']:6.0f} us/request  "
        f"wall {result['total_s']:6.1f} s (upload {result['upload_s']:.1f}, create+wait "
        f"{result['create_and_wait_s']:.1f}, download {result['download_s']:.1f})  [{result['code']}]"
        + (f"  state.json {result['state_json_mb']:.1f} MB" if "state_json_mb" in result else "")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--old-root", help="a checkout whose sandbox runs the same job first, for before/after")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="print the sandbox's N top functions")
    parser.add_argument("--in-progress-s", type=float, help="each batch's in_progress span (sandbox seconds)")
    parser.add_argument("--state-dir", action="store_true", help="the sandbox persists to a temporary --state-dir")
    parser.add_argument("--long", action="store_true", help="e2e_bench's 300-1,500 character prompts")
    args = parser.parse_args()
    span = "" if args.in_progress_s is None else f", in_progress {args.in_progress_s:g} s"
    kind = ", long prompts" if args.long else ""
    print(f"sandbox_bench: {args.requests:,} requests{span}{kind}, load {load():.1f} at start")
    results = {}
    if args.old_root:
        results["before"] = measure(args.old_root, args.requests, 0, args.in_progress_s, args.state_dir, args.long)
        _print("before", results["before"])
    results["after"] = measure(None, args.requests, args.profile, args.in_progress_s, args.state_dir, args.long)
    _print("after", results["after"])
    if "before" in results:
        before, after = results["before"], results["after"]
        print(
            f"ratio   RSS {after['peak_rss_mb'] / before['peak_rss_mb']:.2f}x, "
            f"CPU/request {after['cpu_us_per_request'] / before['cpu_us_per_request']:.2f}x  (load {load():.1f} at end)"
        )
    if args.profile:
        print(results["after"]["profile"])


if __name__ == "__main__":
    main()
