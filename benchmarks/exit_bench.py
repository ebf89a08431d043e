"""What a process that loaded the project spends after its work is done: the interpreter's exit.

CPython's exit collects the whole heap again (while it clears the modules) before the process frees it all. The
project's processes freeze the heap at exit instead (``batch_pipeline/process_exit.py``). This times, in child
processes alternated round by round:

- ``code location``: a process that imports ``batch_pipeline.definitions`` (what each Dagster code server and run
  worker does first) and exits;
- ``cli run``: ``batch-pipeline run`` of the demo job (``data/jobs/demo.yaml``, 2,000 rows) on a sandbox this
  script starts, so the child's CPU is its own, with a fresh home and ``DAGSTER_HOME`` each time.

Each child stamps its CPU seconds in its last ``atexit`` handler (registered first, so it runs after the project's
freeze); the kernel's count at its end (``wait4``) less that stamp is what the exit cost. The reference is the same
child with the freeze unregistered (``atexit.unregister(gc.freeze)``), in the same run.

    python benchmarks/exit_bench.py [--rounds 3] [--only "code location"]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from batch_pipeline.sandbox import start_sandbox_process, stop_sandbox_process  # noqa: E402

CHILD = """
import atexit, gc, sys, time
stamp = sys.argv[1]
def _stamp():
    with open(stamp, "w") as f:
        f.write(repr(time.process_time()))
atexit.register(_stamp)
{work}
if sys.argv[2] == "reference":
    atexit.unregister(gc.freeze)
sys.exit(code)
"""
WORK = {
    "code location": "import batch_pipeline.definitions\ncode = 0",
    "cli run": "from batch_pipeline.cli import main\ncode = main(['run', 'data/jobs/demo.yaml', '--home', sys.argv[3]])",
}


def child(name: str, variant: str, sandbox_url: str) -> tuple[float, float]:
    """(CPU s in all, CPU s after the last atexit handler) of one child."""
    tmp = Path(tempfile.mkdtemp(prefix="exit_bench_"))
    try:
        (tmp / "dagster").mkdir()
        env = {**os.environ, "DAGSTER_HOME": str(tmp / "dagster"), "BATCH_PIPELINE_SANDBOX_URL": sandbox_url}
        stamp = tmp / "stamp"
        command = [sys.executable, "-c", CHILD.format(work=WORK[name]), str(stamp), variant, str(tmp / "home")]
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
        err = proc.stderr.read().decode() if proc.stderr else ""
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"{name} ({variant}) failed:\n{err[-2000:]}")
        cpu = usage.ru_utime + usage.ru_stime
        return cpu, cpu - float(stamp.read_text())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", choices=sorted(WORK))
    args = ap.parse_args()
    sandbox, url = start_sandbox_process(0)
    figures: dict[tuple[str, str], list[tuple[float, float]]] = {}
    try:
        for _ in range(args.rounds):
            for name in [args.only] if args.only else list(WORK):
                for variant in ("frozen", "reference"):
                    figures.setdefault((name, variant), []).append(child(name, variant, url))
    finally:
        stop_sandbox_process(sandbox)
    print(f"exit_bench: {args.rounds} rounds, load {os.getloadavg()[0]:.1f} at the end")
    for name in [args.only] if args.only else list(WORK):
        line = [f"  {name:14s}"]
        medians = {}
        for variant in ("frozen", "reference"):
            runs = figures[(name, variant)]
            medians[variant] = statistics.median(after for _, after in runs)
            total = statistics.median(cpu for cpu, _ in runs)
            exits = ", ".join(f"{after:.2f}" for _, after in runs)
            line.append(f"{variant}: exit {medians[variant]:.2f} CPU s (runs {exits}), process {total:.2f}")
        saved = medians["reference"] - medians["frozen"]
        print("   ".join(line) + f"   saved {saved:.2f} CPU s a process")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
