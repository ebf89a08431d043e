"""What a run costs while it only waits on its provider: CPU seconds of ``batch-pipeline run`` per second of waiting.

A provider batch takes minutes to a day; the run spends nearly all of that waiting, so whatever it does per second
of waiting (polls, the live display, its status line) is paid for the whole day. The job is ``e2e_bench``'s
(openai_batch on the sandbox, a choice output) on a few thousand rows, no canary, in a few shards collected three
at a time (``collect_shards_at_once``'s default). It runs twice per round, each in a fresh home against a fresh
sandbox:

- quick: every batch in progress for the sandbox's default 0.2 s;
- waiting: every batch in progress for ``--wait-s`` (the sandbox's server-wide scenario).

The same work is done in both, so the run's CPU while it waits is (CPU waiting - CPU quick) / (wall waiting -
wall quick): the figure printed per second and per hour of waiting. The two runs' own CPU differs by up to ~0.5 s
from run to run, so a wait under a minute or so is lost in that noise (a short one can even print a negative
rate). ``--old-root DIR`` runs both against another checkout too (``PYTHONPATH=DIR``), alternating, for a before
and after in the same run.

    python benchmarks/wait_bench.py [--wait-s 60] [--rows 4000] [--shard 1000] [--repeat 2] [--old-root DIR]
"""

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from batch_pipeline.sandbox import SandboxAdmin, start_sandbox_process  # noqa: E402
from benchmarks.e2e_bench import job_spec, run_child, run_env  # noqa: E402
from benchmarks.make_rows import rows_file  # noqa: E402


def run_once(root: Path, rows_path: Path, shard: int, in_progress_s: float | None) -> tuple[float, float]:
    """(wall s, CPU s) of one ``batch-pipeline run`` of the job from the checkout at ``root``."""
    with tempfile.TemporaryDirectory(prefix="wait_bench_") as tmp:
        jobs = Path(tmp) / "jobs"
        jobs.mkdir()
        spec = job_spec("wait", rows_path, shard)
        spec.pop("canary")
        spec_path = jobs / "wait.yaml"
        spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
        sandbox, url = start_sandbox_process(0)
        try:
            if in_progress_s is not None:
                SandboxAdmin(url).set_scenario("normal", in_progress_s=in_progress_s)
            env = {**run_env(Path(tmp), url), "PYTHONPATH": str(root)}
            command = [sys.executable, "-m", "batch_pipeline.cli", "run", str(spec_path)]
            code, cpu, _, wall, output, _ = run_child(command, env, cwd=tmp)
        finally:
            sandbox.terminate()
            sandbox.wait()
        if code != 0:
            raise SystemExit(f"the run from {root} exited {code}:\n{output[-3000:]}")
        return wall, cpu


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wait-s", type=float, default=60.0, help="each batch's time in progress on the sandbox")
    ap.add_argument("--rows", type=int, default=4000)
    ap.add_argument("--shard", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=2, help="rounds; the median of each tree's rounds is printed")
    ap.add_argument("--old-root", help="another checkout run alternately, for a before and after")
    args = ap.parse_args(argv)
    rows_path, _ = rows_file(args.rows, short=True)
    trees = {"this tree": ROOT, **({"old": Path(args.old_root).resolve()} if args.old_root else {})}
    rates: dict[str, list[float]] = {name: [] for name in trees}
    print(f"wait: {args.rows:,} rows in shards of {args.shard:,}, batches in progress {args.wait_s:g} s against 0.2 s")
    for round_ in range(1, args.repeat + 1):
        for name, root in trees.items():
            quick_wall, quick_cpu = run_once(root, rows_path, args.shard, None)
            wall, cpu = run_once(root, rows_path, args.shard, args.wait_s)
            rate = (cpu - quick_cpu) / max(wall - quick_wall, 1e-9)
            rates[name].append(rate)
            print(
                f"  round {round_} {name:9s}  quick {quick_wall:5.1f} s wall, {quick_cpu:5.2f} CPU s;  waiting "
                f"{wall:5.1f} s wall, {cpu:5.2f} CPU s  ->  {rate:.4f} CPU s per s of waiting  load "
                f"{os.getloadavg()[0]:.1f}",
                flush=True,
            )
    for name, got in rates.items():
        median = statistics.median(got)
        print(f"  {name:9s} median {median:.4f} CPU s per s of waiting = {median * 3600:,.0f} CPU s per hour")
    if args.old_root:
        new, old = statistics.median(rates["this tree"]), statistics.median(rates["old"])
        print(f"  this tree / old: {new / old:.2f}x" if old > 0 else "  old: no measurable cost")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
