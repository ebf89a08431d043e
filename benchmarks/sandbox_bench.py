"""The sandbox's own cost for an N-request batch job: its peak RSS and CPU per request (issue 19).

The sandbox runs in a spawned child (an in-process ``SandboxServer``), so its figures are its own; this process
drives it through the real ``openai`` SDK: upload the input files (50,000 requests each, the API's cap), create the
batches, poll them to ``completed``, stream every output file down and count its lines. ``--provider anthropic``
drives the ``anthropic`` SDK instead (message batches of 100,000 requests, the API's cap, results read through
``batches.results``), ``--provider gemini`` the ``google-genai`` SDK (a JSONL file of 50,000 requests per batch,
uploaded, run and its responses file downloaded). The child reports its peak
RSS (``VmHWM``) and the CPU seconds it spent from ready to done, divided by N.

``--old-root DIR`` runs the same job a second time against the sandbox of another checkout, in the same run:
``git archive COMMIT batch_pipeline | tar -x -C DIR`` (the commit before the spool: 231f840). ``--profile N``
prints the sandbox's N heaviest functions by own time (cProfile over every request it served). ``--in-progress-s S``
runs every batch's in_progress over S sandbox seconds (the scenario's default is 0.2 s: each batch is answered
whole in one poll), so all the batches are in progress at once, as a real job's are, and their answers so far add up. ``--state-dir``
gives the sandbox a temporary state directory (it saves ``state.json`` after every change, as a dry run that must
survive a restart does) and prints the last ``state.json``'s size.

Run: nice -n 19 python benchmarks/sandbox_bench.py --requests 100000 [--in-progress-s 60] [--old-root /tmp/old]
     [--profile 25] [--long] [--provider anthropic|gemini]
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
PER_BATCH_BY_PROVIDER = {"openai": 50_000, "anthropic": 100_000, "gemini": 50_000}
MODEL = "gpt-4o-mini"
CLAUDE = "claude-haiku-4-5"
GEMINI = "gemini-2.5-flash"
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


def tickets(start: int, count: int, long: bool = False) -> list[str]:
    """The user texts of ``batch_file``'s requests, for the other providers' requests."""
    pool, lo, hi = long_texts() if long else ("", 0, 0)
    return [
        f"Ticket {i}: " + _slice(pool, i, lo, hi) if long else f"Ticket {i}: my invoice was charged twice, please help"
        for i in range(start, start + count)
    ]


def anthropic_requests(start: int, count: int, long: bool = False) -> list[dict[str, Any]]:
    """``count`` message-batch requests with a forced label tool, as the pipeline sends them."""
    schema = {"type": "object", "properties": {"label": {"type": "string", "enum": ["billing", "bug", "other"]}}}
    tool = {"name": "label", "description": "The ticket's label.", "input_schema": schema}
    return [
        {
            "custom_id": f"r{start + n}",
            "params": {
                "model": CLAUDE,
                "max_tokens": 32,
                "system": "Label the ticket: billing, bug or other.",
                "tools": [tool],
                "tool_choice": {"type": "tool", "name": "label"},
                "messages": [{"role": "user", "content": text}],
            },
        }
        for n, text in enumerate(tickets(start, count, long))
    ]


def gemini_file(start: int, count: int, long: bool = False) -> bytes:
    """``count`` Gemini batch lines asking for a labelled JSON answer."""
    schema = {"type": "object", "properties": {"label": {"type": "string", "enum": ["billing", "bug", "other"]}}}
    config = {"responseMimeType": "application/json", "responseJsonSchema": schema, "maxOutputTokens": 32}
    lines = []
    for n, text in enumerate(tickets(start, count, long)):
        request = {
            "contents": [{"role": "user", "parts": [{"text": text}]}],
            "systemInstruction": {"parts": [{"text": "Label the ticket: billing, bug or other."}]},
            "generationConfig": config,
        }
        lines.append(json.dumps({"key": f"r{start + n}", "request": request}, separators=(",", ":")))
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
    """OpenAI: upload, create, poll to completed and stream every output down; the phases' wall seconds."""
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


def _slow_scenario(url: str, in_progress_s: float | None) -> None:
    """The server-wide scenario with every batch's in_progress over ``in_progress_s`` (Anthropic and Gemini
    batches take the server's scenario, not one from metadata)."""
    if in_progress_s is not None:
        from batch_pipeline.sandbox import SandboxAdmin

        SandboxAdmin(url).set_scenario("normal", in_progress_s=in_progress_s)


def drive_anthropic(url: str, requests: int, in_progress_s: float | None, long: bool = False) -> dict[str, float]:
    """Anthropic: create the message batches, poll them to ended and read every result line through the SDK."""
    import anthropic

    _slow_scenario(url, in_progress_s)
    client = anthropic.Anthropic(base_url=url, api_key="sk-sandbox", max_retries=0, timeout=600)
    per_batch = PER_BATCH_BY_PROVIDER["anthropic"]
    t0 = time.perf_counter()
    batches = []
    for start in range(0, requests, per_batch):
        body = anthropic_requests(start, min(per_batch, requests - start), long)
        batches.append(client.messages.batches.create(requests=body).id)  # type: ignore[arg-type]
    phases = {"upload_s": time.perf_counter() - t0}
    for batch_id in batches:
        while client.messages.batches.retrieve(batch_id).processing_status != "ended":
            time.sleep(0.05)
    phases["create_and_wait_s"] = time.perf_counter() - t0 - phases["upload_s"]
    t = time.perf_counter()
    lines = sum(
        1
        for batch_id in batches
        for line in client.messages.batches.results(batch_id)
        if line.result.type == "succeeded"
    )
    phases["download_s"] = time.perf_counter() - t
    phases["total_s"] = time.perf_counter() - t0
    assert lines == requests, (lines, requests)
    client.close()
    return phases


def drive_gemini(url: str, requests: int, in_progress_s: float | None, long: bool = False) -> dict[str, float]:
    """Gemini: upload the JSONL files, create the batches, poll them to done and download every responses file."""
    import io

    from google import genai

    _slow_scenario(url, in_progress_s)
    client = genai.Client(api_key="sandbox", http_options={"base_url": url, "timeout": 600_000})
    per_batch = PER_BATCH_BY_PROVIDER["gemini"]
    t0 = time.perf_counter()
    names = []
    for start in range(0, requests, per_batch):
        data = gemini_file(start, min(per_batch, requests - start), long)
        upload = client.files.upload(file=io.BytesIO(data), config={"mime_type": "jsonl", "display_name": "in"})
        names.append(str(upload.name))
    phases = {"upload_s": time.perf_counter() - t0}
    jobs = [str(client.batches.create(model=GEMINI, src=name).name) for name in names]
    outputs = []
    for name in jobs:
        while not (job := client.batches.get(name=name)).done:
            time.sleep(0.05)
        assert job.state is not None and job.state.name == "JOB_STATE_SUCCEEDED", job.state
        assert job.dest is not None and job.dest.file_name
        outputs.append(job.dest.file_name)
    phases["create_and_wait_s"] = time.perf_counter() - t0 - phases["upload_s"]
    t = time.perf_counter()
    lines = sum(client.files.download(file=name).count(b"\n") for name in outputs)
    phases["download_s"] = time.perf_counter() - t
    phases["total_s"] = time.perf_counter() - t0
    assert lines == requests, (lines, requests)
    return phases


DRIVERS = {"openai": drive, "anthropic": drive_anthropic, "gemini": drive_gemini}


def measure(
    root: str | None,
    requests: int,
    profile_top: int,
    in_progress_s: float | None,
    persist: bool = False,
    long: bool = False,
    provider: str = "openai",
) -> dict[str, Any]:
    """One job against the sandbox of ``root`` (None: this checkout) in its own spawned child."""
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=serve_sandbox, args=(root, theirs, profile_top, persist))
    child.start()
    url = ours.recv()
    phases = DRIVERS[provider](url, requests, in_progress_s, long)
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
    parser.add_argument("--provider", choices=sorted(DRIVERS), default="openai", help="whose SDK drives the job")
    args = parser.parse_args()
    span = "" if args.in_progress_s is None else f", in_progress {args.in_progress_s:g} s"
    kind = ", long prompts" if args.long else ""
    print(f"sandbox_bench: {args.provider}, {args.requests:,} requests{span}{kind}, load {load():.1f} at start")
    results = {}
    if args.old_root:
        results["before"] = measure(
            args.old_root, args.requests, 0, args.in_progress_s, args.state_dir, args.long, args.provider
        )
        _print("before", results["before"])
    results["after"] = measure(
        None, args.requests, args.profile, args.in_progress_s, args.state_dir, args.long, args.provider
    )
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
