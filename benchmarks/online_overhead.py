"""Online executor overhead against the sandbox on loopback, at concurrency 64.

Variants, each sending the same ``--requests`` chat-completion bodies (byte-identical, built by the executor's
``BodyBuilder``) to a sandbox child process:

- ``ceiling``: the least a client can do: 64 threads, one ``http.client`` keep-alive connection each, the
  response read and dropped (no parsing). Its wall time is what the sandbox itself costs.
- ``executor/http``: ``OnlineExecutor.run`` with the default transport (stdlib keep-alive, response parsed,
  limiter, retries bookkeeping, Arrow tables every 256 results).
- ``executor/sdk``: the same executor with ``transport: sdk`` (openai SDK, ``with_raw_response``, worker threads).
- ``threads/sdk`` and ``asyncio/sdk``: bare loops without any executor logic (``with_raw_response``, JSON parsed):
  64 threads sharing a sync ``OpenAI`` client, and 64 tasks sharing an ``AsyncOpenAI`` client. Threads vs asyncio.

Per variant: requests/s, client CPU ms per request (this process; the sandbox runs in its own), and
overhead = (wall - ceiling wall) / requests in ms. The median of ``--repeat`` rounds (variants interleaved).
The figures are written to ``benchmarks/out/online_overhead.json`` and to the section "Online executor
overhead" of ``benchmarks/README.md`` (that section only; the rest of the file is left alone).

    python benchmarks/online_overhead.py [--requests 4000] [--repeat 3] [--concurrency 64]
"""

import argparse
import asyncio
import http.client
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

import openai  # noqa: E402
import pyarrow as pa  # noqa: E402

from batch_pipeline.core.ledger.executor import RequestPlan, ShardWork  # noqa: E402
from batch_pipeline.core.spec.job import BackendSpec
from batch_pipeline.core.spec.loading import parse_spec
from batch_pipeline.executors.online.transport import BodyBuilder  # noqa: E402
from batch_pipeline.executors.registry import create_executor  # noqa: E402
from batch_pipeline.sandbox import SandboxAdmin, start_sandbox_process, stop_sandbox_process  # noqa: E402
from benchmarks._harness import OUT, cpu_s, load  # noqa: E402

SECTION = "## Online executor overhead"
SPEC = """
name: bench
input: {path: in.jsonl, text_field: body}
prompt: {version: v1, system: "You label support tickets. Answer with one label only.", template: "{body}"}
model: gpt-4o-mini
backend: {name: online}
sampling: {max_tokens: 16}
output: {choice: [billing, bug, feature_request, account, other]}
"""


def make_work(n: int) -> ShardWork:
    plan = RequestPlan.from_spec(parse_spec(SPEC))
    items = pa.table(
        {
            "request_id": [f"{i:064x}" for i in range(n)],
            "user_prompt": [f"Ticket {i}: I was charged twice this month, please refund." for i in range(n)],
        }
    )
    return ShardWork("bench", "s00001", 1, "bench:s00001:1", plan, items)


def ceiling(url: str, work: ShardWork, concurrency: int) -> None:
    """64 keep-alive connections, the same bodies, responses read and dropped."""
    builder = BodyBuilder(work.plan, None)
    bodies = iter([builder.data(p) for p in work.items.column("user_prompt").to_pylist()])
    lock = threading.Lock()
    host, port = url.split("//")[1].split(":")
    headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-sandbox"}
    failures: list[int] = []

    def worker() -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        while True:
            with lock:
                body = next(bodies, None)
            if body is None:
                break
            conn.request("POST", "/v1/chat/completions", body, headers)
            response = conn.getresponse()
            response.read()
            if response.status != 200:
                failures.append(response.status)
        conn.close()

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures[:5]


def executor(transport: str) -> Callable[[str, ShardWork, int], None]:
    def run(url: str, work: ShardWork, concurrency: int) -> None:
        ex = create_executor(
            BackendSpec(name="online", settings={"sandbox": True, "transport": transport, "concurrency": concurrency})
        )
        rows = sum(t.num_rows for t in ex.run(work))  # type: ignore[union-attr]
        assert rows == work.items.num_rows

    return run


def asyncio_sdk(url: str, work: ShardWork, concurrency: int) -> None:
    """A bare AsyncOpenAI loop: no limiter, no retries, no tables."""
    builder = BodyBuilder(work.plan, None)
    prompts = iter(work.items.column("user_prompt").to_pylist())

    async def main() -> None:
        import httpx2

        limits = httpx2.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        client = openai.AsyncOpenAI(
            base_url=url + "/v1",
            api_key="sk-sandbox",
            max_retries=0,
            http_client=openai.DefaultAsyncHttpxClient(limits=limits),
        )

        async def worker() -> None:
            for prompt in prompts:
                raw = await client.chat.completions.with_raw_response.create(**builder.kwargs(prompt))
                json.loads(raw.text)

        await asyncio.gather(*[worker() for _ in range(concurrency)])
        await client.close()

    asyncio.run(main())


def threads_sdk(url: str, work: ShardWork, concurrency: int) -> None:
    """The same bare loop as ``asyncio_sdk`` on worker threads with the sync client."""
    import httpx2

    builder = BodyBuilder(work.plan, None)
    prompts = iter(work.items.column("user_prompt").to_pylist())
    lock = threading.Lock()
    limits = httpx2.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    client = openai.OpenAI(
        base_url=url + "/v1", api_key="sk-sandbox", max_retries=0, http_client=openai.DefaultHttpxClient(limits=limits)
    )

    def worker() -> None:
        while True:
            with lock:
                prompt = next(prompts, None)
            if prompt is None:
                return
            raw = client.chat.completions.with_raw_response.create(**builder.kwargs(prompt))
            json.loads(raw.text)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    client.close()


VARIANTS: dict[str, Callable[[str, ShardWork, int], None]] = {
    "ceiling": ceiling,
    "executor/http": executor("http"),
    "executor/sdk": executor("sdk"),
    "threads/sdk": threads_sdk,
    "asyncio/sdk": asyncio_sdk,
}


def measure(args: argparse.Namespace) -> dict:
    proc, url = start_sandbox_process(port=0)
    os.environ["BATCH_PIPELINE_SANDBOX_URL"] = url
    admin = SandboxAdmin(url)
    work = make_work(args.requests)
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in VARIANTS}
    try:
        for fn in VARIANTS.values():  # warm-up: imports, connections, code paths
            admin.reset()
            fn(url, make_work(200), args.concurrency)
        for _ in range(args.repeat):
            for name, fn in VARIANTS.items():
                admin.reset()
                cpu, wall = cpu_s(), time.perf_counter()
                fn(url, work, args.concurrency)
                runs[name].append((time.perf_counter() - wall, cpu_s() - cpu))
                billed = len(admin.ledger())
                assert billed == args.requests, (name, billed)
    finally:
        stop_sandbox_process(proc)
    n = args.requests
    ceiling_wall = statistics.median(w for w, _ in runs["ceiling"])
    result = {
        "requests": n,
        "concurrency": args.concurrency,
        "repeat": args.repeat,
        "cores": os.cpu_count(),
        "load_1m": round(load(), 2),
        "variants": {},
    }
    for name, samples in runs.items():
        wall = statistics.median(w for w, _ in samples)
        cpu = statistics.median(c for _, c in samples)
        result["variants"][name] = {
            "wall_s": round(wall, 3),
            "requests_per_s": round(n / wall),
            "client_cpu_ms_per_request": round(cpu / n * 1000, 3),
            "overhead_ms_per_request": round((wall - ceiling_wall) / n * 1000, 3),
        }
    return result


def markdown(result: dict) -> str:
    lines = [
        SECTION,
        "",
        f"`python benchmarks/online_overhead.py --requests {result['requests']} --repeat {result['repeat']}`: "
        f"{result['requests']} chat completions at concurrency {result['concurrency']} against the sandbox "
        f"(a child process) on loopback; {result['cores']} cores, load {result['load_1m']}; medians.",
        "Overhead = (wall - ceiling wall) / requests. The ceiling is 64 bare `http.client` keep-alive "
        "connections that read and drop each response: the sandbox's own cost.",
        "",
        "| variant | requests/s | wall s | client CPU ms/request | overhead ms/request |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, v in result["variants"].items():
        overhead = "-" if name == "ceiling" else f"{v['overhead_ms_per_request']:.3f}"
        lines.append(
            f"| {name} | {v['requests_per_s']} | {v['wall_s']:.2f} | "
            f"{v['client_cpu_ms_per_request']:.3f} | {overhead} |"
        )
    v = result["variants"]
    lines += [
        "",
        "`executor/http` is the default transport (target: overhead < 1 ms). The openai SDK costs "
        f"{v['threads/sdk']['client_cpu_ms_per_request']:.1f} (threads) / "
        f"{v['asyncio/sdk']['client_cpu_ms_per_request']:.1f} (asyncio) ms of client CPU per request, so "
        "with it the client, not the endpoint, sets the pace on a small machine; `transport: sdk` is for "
        "where its HTTP client is needed (proxies). Threads vs asyncio with the SDK, bare loops: "
        f"{v['threads/sdk']['requests_per_s']} vs {v['asyncio/sdk']['requests_per_s']} requests/s; the "
        "executor uses worker threads (no event loop to bridge into the runner's synchronous iterator).",
        "",
    ]
    return "\n".join(lines)


def write_readme(section: str) -> None:
    """Replace this benchmark's own section of README.md (or append it); leave every other line alone."""
    path = HERE / "README.md"
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    start = text.find(SECTION)
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + len(SECTION))
        text = text[:start] + section + (text[end + 1 :] if end >= 0 else "")
    path.write_text(text, encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--no-readme", action="store_true", help="print only; do not touch README.md")
    args = parser.parse_args()
    result = measure(args)
    OUT.mkdir(exist_ok=True)
    (OUT / "online_overhead.json").write_text(json.dumps(result, indent=2))
    section = markdown(result)
    print(section)
    if not args.no_readme:
        write_readme(section)


if __name__ == "__main__":
    main()
