"""The sandbox's hand-rolled HTTP layer (stdlib ThreadingHTTPServer + our router + our multipart parser) against
Starlette on uvicorn (httptools, uvloop) with python-multipart, with the same SandboxApp behind both.

1. End to end through the openai SDK: a batch of N requests (50,000 per batch, the API's cap) uploaded, created,
   polled to completion and its output downloaded; each server in its own process on a free loopback port.
2. Raw request rate: GET /_sandbox/clock (the lightest route) on one keep-alive connection, then 8 threads.
3. In-process: parsing one 50,000-line upload body with our parser and with python-multipart.

Run: python benchmarks/sandbox_http_bench.py [--requests 200000] [--raw 5000]
Needs python-multipart (pip install python-multipart); starlette and uvicorn come with dagster-webserver.
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx2
import openai

from batch_pipeline.sandbox import SandboxAdmin, start_sandbox_process, stop_sandbox_process

PER_BATCH = 50_000
MODEL = "gpt-4o-mini"


# -- the Starlette variant: a catch-all route handing our Request to the same SandboxApp -------------------------
def starlette_app():
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request as StarletteRequest
    from starlette.responses import Response as StarletteResponse
    from starlette.routing import Route

    from batch_pipeline.sandbox.app import SandboxApp
    from batch_pipeline.sandbox.routing import Request

    sandbox = SandboxApp()

    async def endpoint(request: StarletteRequest) -> StarletteResponse:
        body = await request.body()
        ours = Request(
            request.method,
            request.url.path.rstrip("/") or "/",
            dict(request.query_params),
            {k.lower(): v for k, v in request.headers.items()},
            body,
        )
        answer = await run_in_threadpool(sandbox.handle, ours)
        return StarletteResponse(
            answer.encode(), status_code=answer.status, headers=answer.headers, media_type=answer.content_type
        )

    methods = ["GET", "POST", "DELETE", "PUT", "PATCH"]
    return Starlette(routes=[Route("/{path:path}", endpoint, methods=methods)])


def serve_starlette() -> None:
    import socket

    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    config = uvicorn.Config(starlette_app(), host="127.0.0.1", port=port, log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    threading.Thread(
        target=lambda: (time.sleep(0.5), print(f"SANDBOX READY http://127.0.0.1:{port}", flush=True)), daemon=True
    ).start()
    server.run()


def start_starlette() -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, __file__, "--serve-starlette"], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    if not line.startswith("SANDBOX READY "):
        proc.kill()
        raise RuntimeError(f"starlette sandbox did not start: {line!r}")
    url = line.split()[-1]
    for _ in range(100):  # uvicorn may print before it accepts
        try:
            httpx2.get(url + "/_sandbox/clock", timeout=1)
            return proc, url
        except httpx2.TransportError:
            time.sleep(0.05)
    raise RuntimeError("starlette sandbox never answered")


# -- workloads -----------------------------------------------------------------------------------------------------
def batch_file(start: int, n: int) -> bytes:
    head = '{"custom_id":"r'
    mid = (
        '","method":"POST","url":"/v1/chat/completions","body":{"model":"' + MODEL + '","max_tokens":16,'
        '"messages":[{"role":"system","content":"Label the ticket: billing, bug or other."},'
        '{"role":"user","content":'
    )
    return "".join(
        f"{head}{i}{mid}{json.dumps(f'Ticket {i}: my invoice was charged twice, please help')}}}]}}}}\n"
        for i in range(start, start + n)
    ).encode()


def end_to_end(url: str, requests: int) -> dict[str, float]:
    client = openai.OpenAI(base_url=url + "/v1", api_key="sk-sandbox", max_retries=0, timeout=600)
    SandboxAdmin(url, timeout=120).reset()
    files = [batch_file(s, min(PER_BATCH, requests - s)) for s in range(0, requests, PER_BATCH)]
    phases: dict[str, float] = {}
    t0 = time.perf_counter()
    ids = [client.files.create(file=(f"in{i}.jsonl", data), purpose="batch").id for i, data in enumerate(files)]
    phases["upload_s"] = time.perf_counter() - t0
    t = time.perf_counter()
    batches = [
        client.batches.create(input_file_id=f, endpoint="/v1/chat/completions", completion_window="24h").id for f in ids
    ]
    phases["create_s"] = time.perf_counter() - t
    t = time.perf_counter()
    outputs, polls = [], 0
    for batch_id in batches:
        while True:
            polls += 1
            batch = client.batches.retrieve(batch_id)
            if batch.status in ("completed", "failed", "expired", "cancelled"):
                break
            time.sleep(0.05)
        assert batch.status == "completed", batch.status
        outputs.append(batch.output_file_id)
    phases["poll_s"] = time.perf_counter() - t
    t = time.perf_counter()
    got = sum(client.files.content(f).content.count(b"\n") for f in outputs)
    phases["download_s"] = time.perf_counter() - t
    phases["total_s"] = time.perf_counter() - t0
    phases["polls"] = polls
    assert got == requests, got
    client.close()
    return phases


def raw_rate(url: str, n: int, threads: int) -> float:
    def worker(count: int) -> None:
        with httpx2.Client(timeout=30) as c:
            for _ in range(count):
                c.get(url + "/_sandbox/clock").raise_for_status()

    per = n // threads
    t = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(worker, [per] * threads))
    return per * threads / (time.perf_counter() - t)


def multipart_parse(lines: int, rounds: int = 5) -> dict[str, float]:
    import python_multipart

    from batch_pipeline.sandbox.multipart import parse_multipart

    data = batch_file(0, lines)
    boundary = "bench-boundary-7d1f"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
            f"Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        + data
        + f"\r\n--{boundary}--\r\n".encode()
    )
    ctype = f"multipart/form-data; boundary={boundary}"

    def ours() -> int:
        return len(parse_multipart(ctype, body)["file"].data)

    def theirs() -> int:
        chunks: list[bytes] = []
        parser = python_multipart.MultipartParser(boundary, {"on_part_data": lambda b, s, e: chunks.append(b[s:e])})
        parser.write(body)
        parser.finalize()
        return sum(map(len, chunks))

    out = {}
    for name, fn in (("ours", ours), ("python_multipart", theirs)):
        fn()
        t = time.perf_counter()
        for _ in range(rounds):
            fn()
        out[name] = (time.perf_counter() - t) / rounds
    out["body_mb"] = len(body) / 2**20
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--raw", type=int, default=5000)
    parser.add_argument("--serve-starlette", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    import importlib.util

    if importlib.util.find_spec("python_multipart") is None:  # not a dependency of the project
        sys.exit("sandbox_http_bench: needs python-multipart for its Starlette side: pip install python-multipart")
    if args.serve_starlette:
        serve_starlette()
        return
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores")
    mp = multipart_parse(PER_BATCH)
    print(
        f"multipart parse of a {mp['body_mb']:.1f} MB upload: ours {mp['ours'] * 1000:.1f} ms, python-multipart "
        f"{mp['python_multipart'] * 1000:.1f} ms (ratio {mp['python_multipart'] / mp['ours']:.2f}x)"
    )
    results = {}
    for name, start in (("stdlib", lambda: start_sandbox_process(port=0)), ("starlette", start_starlette)):
        proc, url = start()
        try:
            e2e = end_to_end(url, args.requests)
            one = raw_rate(url, args.raw, 1)
            many = raw_rate(url, args.raw, 8)
        finally:
            stop_sandbox_process(proc) if name == "stdlib" else (proc.terminate(), proc.wait(10))
        results[name] = (e2e, one, many)
        print(
            f"{name:9s} e2e {args.requests} requests: total {e2e['total_s']:.2f} s (upload {e2e['upload_s']:.2f}, "
            f"create {e2e['create_s']:.2f}, poll {e2e['poll_s']:.2f} in {int(e2e['polls'])} polls, download "
            f"{e2e['download_s']:.2f}); raw GET rate {one:.0f} req/s on 1 connection, {many:.0f} req/s on 8"
        )
    ref, alt = results["stdlib"], results["starlette"]
    print(
        f"starlette / stdlib: e2e total {alt[0]['total_s'] / ref[0]['total_s']:.2f}x the time, upload "
        f"{alt[0]['upload_s'] / ref[0]['upload_s']:.2f}x, download {alt[0]['download_s'] / ref[0]['download_s']:.2f}x;"
        f" raw rate {alt[1] / ref[1]:.2f}x (1 conn), {alt[2] / ref[2]:.2f}x (8 threads)"
    )


if __name__ == "__main__":
    main()
