"""Small shared helpers: run a function in a ``spawn`` child (so peak RSS is per variant), timers."""

import importlib
import multiprocessing as mp
import resource
import statistics
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"


def maxrss_mb() -> float:
    """Peak RSS of this process so far, in MiB: ``VmHWM`` of this process's own memory map. (``ru_maxrss`` is not
    it in a spawned child: Linux carries the parent's high-water mark across fork and exec, so a small child of a
    2 GB parent reported 2 GB.)"""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_s() -> float:
    """User + system CPU seconds of this process so far (all threads)."""
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def load() -> float:
    """1-minute load average: other work on the machine makes wall-clock figures noisy."""
    import os

    return os.getloadavg()[0]


def _child(target: str, args: tuple, conn) -> None:
    try:
        from batch_pipeline.cli_jobs import cli_settings

        cli_settings(None)  # the process edge the CLI runs, so a variant allocates as the product does (Arrow's pool)
        module, name = target.split(":")
        fn = getattr(importlib.import_module(module), name)
        conn.send(fn(*args))
    except BaseException as exc:  # report, don't hang the parent
        import traceback

        conn.send({"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
    finally:
        conn.close()


def run_in_child(target: str, *args) -> dict:
    """Call ``module:function(*args)`` in a fresh spawned interpreter; return its dict result."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_child, args=(target, args, child))
    wall = time.perf_counter()
    p.start()
    child.close()
    result = parent.recv()
    p.join()
    if "error" in result:
        raise RuntimeError(f"{target} failed: {result['error']}\n{result['traceback']}")
    result["child_wall_s"] = time.perf_counter() - wall
    return result


def repeat(fn: Callable[[], object], times: int) -> tuple[list[float], object]:
    """Run ``fn`` ``times`` times; the wall times and the last result."""
    out = None
    secs = []
    for _ in range(times):
        t = time.perf_counter()
        out = fn()
        secs.append(time.perf_counter() - t)
    return secs, out


def summary(secs: list[float]) -> str:
    return f"min {min(secs):.3f} s, median {statistics.median(secs):.3f} s over {len(secs)}"


def raw_payload_expr():
    """A provider output line (OpenAI batch, a ``{"label": ...}`` answer) for each synthetic result row, built from
    its ``request_id`` and ``label`` columns: the ~850-byte ``raw_payload`` the store keeps."""
    import polars as pl

    return pl.format(
        '{{"id": "batch_req_{}", "custom_id": "{}", "response": {{"status_code": 200, "request_id": '
        '"req_{}", "body": {{"id": "chatcmpl-x", "object": "chat.completion", "model": '
        '"gpt-4o-mini-2024-07-18", "choices": [{{"index": 0, "message": {{"role": "assistant", '
        '"content": "{{\\"label\\": \\"{}\\"}}", "refusal": null}}, "finish_reason": "stop"}}], '
        '"usage": {{"prompt_tokens": 231, "completion_tokens": 7, "total_tokens": 238}}}}}}, '
        '"error": null}}',
        pl.col("request_id").str.slice(0, 24),
        "request_id",
        pl.col("request_id").str.slice(32, 32),
        "label",
    ).alias("raw_payload")


def compare_ingest(bench: str, path: Path, lines: int, good: int, repeat: int, target: float = 300_000) -> dict:
    """The ingest benchmarks' comparison: ``bench``'s ``reference`` and ``ours`` (``path``, a fresh work dir) each
    in a spawned child, ``repeat`` times alternating, printed run by run; the best of each compared. Returns
    ``{"best", "ratio", "checks"}`` (rows == lines for both, succeeded == ``good`` for ours, ours >= ``target``)."""
    import shutil
    import tempfile

    with open(path, "rb") as f:  # warm the page cache
        while f.read(64 * 2**20):
            pass
    best: dict[str, dict] = {}
    checks: list[tuple[str, bool]] = []
    for _ in range(repeat):
        for variant in ("reference", "ours"):
            work = tempfile.mkdtemp(prefix=f"{bench}-")
            try:
                r = run_in_child(f"benchmarks.{bench}:{variant}", str(path), work)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            r["lines_per_s"] = lines / r["seconds"]
            print(
                f"  {variant:10s} {r['seconds']:6.2f} s (cpu {r['cpu_s']:.2f} s)  {r['lines_per_s']:>10,.0f} lines/s"
                f"  load {load():.1f}  peak RSS {r['peak_rss_mb']:,.0f} MB"
                + (f"  succeeded {r['succeeded']:,}" if r["succeeded"] is not None else ""),
                flush=True,
            )
            checks.append((f"{variant}: rows == lines", r["rows"] == lines))
            if variant == "ours":
                checks.append(("ours: succeeded == generated good labels", r["succeeded"] == good))
            if variant not in best or r["seconds"] < best[variant]["seconds"]:
                best[variant] = r
    ratio = best["reference"]["seconds"] / best["ours"]["seconds"]
    print(
        f"  best: ours {best['ours']['lines_per_s']:,.0f} lines/s, reference "
        f"{best['reference']['lines_per_s']:,.0f}; ratio {ratio:.2f}x"
    )
    checks.append((f"ours >= {target / 1000:.0f}k lines/s", best["ours"]["lines_per_s"] >= target))
    for name, ok in checks:
        print(f"  [{'ok' if ok else 'MISS'}] {name}")
    return {"best": best, "ratio": ratio, "checks": dict(checks)}
