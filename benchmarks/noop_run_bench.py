"""`batch-pipeline run` when there is nothing new to do, on a ~510k-item job (shards of 5,000): wall time and peak RSS
of the command as a user runs it, against the fixed cost of starting the CLI, in the same run.

Which "nothing to do" the CLI can meet: ``run`` lifts a pause, a stop and held shards first (``cli._resume``), and
its passes wait on open batches inline (``waits_inline``) or, when the account's queue is full, poll until room
frees up (``QueueLoop``): none of those returns without new work done. The run that ends with nothing sent is the
one of a finished job run again (the manifest finds no new rows, every shard is settled, the plan is PUBLISH): the
case measured here, as ``run``. ``paused`` is also timed: the same job paused just before (``JobControl.pause``),
which ``run`` lifts and then runs as it always did (Dagster, a manifest run that reads nothing, the plan), up to the
publish, which it skips as the last one still stands (``core/publish/current.py``).

The job: ``make_rows.py --short`` rows (537,000 rows, 510,276 unique: cached under ``benchmarks/out/``), the
demo-shaped choice job on ``openai_batch`` (the sandbox), shards of 5,000 requests, a 300-item canary first, run to
the end once by ``batch-pipeline run`` under ``benchmarks/out/noop_run_bench/<rows>/`` (home, Dagster home, spec;
reused while its ``report.json`` says complete). Each timed run is a fresh ``python -m batch_pipeline.cli run`` child
whose ``BATCH_PIPELINE_SANDBOX_URL`` is a closed port (the CLI starts no sandbox of its own, and a run that asked
the provider anything would fail: a finished job's run asks nothing); its peak RSS and CPU are the kernel's
accounting of that child alone (``os.wait4``). The first run after the build is timed apart (a job built before
the publish basis existed publishes once there, ``core/publish/current.py``).

Same-run references: ``help`` (``batch-pipeline --help``: the interpreter and the CLI module's imports) and
``imports`` (a python that imports what an ordinary ``run`` imports before it does anything: ``batch_pipeline.cli``,
``dagster`` and ``batch_pipeline.defs.pipeline``), so the fixed start-up cost is visible apart from the run's own
work. ``--before REF`` also times the code at a git ref (``git archive`` under ``benchmarks/out/``, imported through
``PYTHONPATH``) on its own copy of the finished job, interleaved with ours.
``--profile`` also writes ``python -X importtime`` and a cProfile of ``cli.main(["run", ...])`` in-process under
the job's folder and prints their top entries.

    python benchmarks/noop_run_bench.py [--rows 537000] [--repeat 3] [--before 114f3a2] [--profile]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from benchmarks._harness import OUT, load  # noqa: E402
from benchmarks.e2e_bench import job_spec as e2e_job_spec  # noqa: E402
from benchmarks.make_rows import rows_file  # noqa: E402

JOB = "noop_bench"
SHARD = 5000
CLOSED_PORT = "http://127.0.0.1:9"  # the no-op runs' provider: nothing listens, so a run that asked it would fail
NOOP_IMPORTS = "import batch_pipeline.cli, batch_pipeline.core.publish.noop"
IMPORTS = "import batch_pipeline.cli, dagster, batch_pipeline.defs.pipeline"


def job_spec(input_path: Path) -> dict:
    """The e2e bench's labelling job (``e2e_bench.job_spec``), in shards of 5,000, with room for long rows."""
    spec = e2e_job_spec(JOB, input_path, SHARD)
    spec["input"]["max_input_tokens"] = 1_000_000
    return spec


class Job:
    """The job's folder: spec, storage root and Dagster home, and the environment a CLI child runs in."""

    def __init__(self, rows: int, suffix: str = ""):
        self.dir = OUT / "noop_run_bench" / f"{rows}{suffix}"
        self.home, self.dagster, self.spec = self.dir / "home", self.dir / "dagster", self.dir / f"{JOB}.yaml"
        self.report = self.home / "jobs" / JOB / "report.json"

    def env(self, sandbox_url: str, code: Path | None = None) -> dict[str, str]:
        """``code``: a checkout whose ``batch_pipeline`` the child imports instead (``--before``)."""
        return {
            **os.environ,
            **({"PYTHONPATH": str(code)} if code else {}),
            "BATCH_PIPELINE_SANDBOX_URL": sandbox_url,
            "BATCH_PIPELINE_HOME": str(self.home),
            "DAGSTER_HOME": str(self.dagster),
            "BATCH_PIPELINE_JOBS": str(self.dir),
        }

    def finished(self) -> bool:
        return self.report.exists() and bool(json.loads(self.report.read_text()).get("complete"))


def timed(cmd: list[str], env: dict[str, str]) -> dict:
    """One child: wall, CPU and peak RSS (its own, ``wait4``), exit code and the tail of its output. It runs in
    ``benchmarks/out`` (``-m`` puts the working directory first on ``sys.path``: the checkout's own package would
    shadow a ``--before`` one)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=OUT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    return {
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "rss_mb": usage.ru_maxrss / 1024,
        "code": os.waitstatus_to_exitcode(status),
        "out": out,
    }


def build(job: Job, rows: int, url: str) -> None:
    path, meta = rows_file(rows, short=True)
    job.dir.mkdir(parents=True, exist_ok=True)
    job.dagster.mkdir(exist_ok=True)
    job.spec.write_text(yaml.safe_dump(job_spec(path), sort_keys=False))
    print(f"build: {rows:,} rows ({meta.get('unique', rows):,} unique) through `batch-pipeline run` ...", flush=True)
    r = timed([sys.executable, "-m", "batch_pipeline.cli", "run", str(job.spec)], job.env(url))
    print(f"build: exit {r['code']} in {r['wall_s']:.0f} s (peak RSS {r['rss_mb']:,.0f} MB)", flush=True)
    if r["code"] != 0 or not job.finished():
        raise SystemExit(f"the build run did not finish the job:\n{r['out'][-3000:]}")


def _median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def before_copy(job: Job, rows: int, ref: str) -> tuple[Job, Path]:
    """The code at ``ref`` (``git archive``) and a copy of the finished job for it to run on (its publishes rewrite
    the report, which would make the next run of ours publish once more)."""
    code = OUT / "noop_run_bench" / f"code-{ref}"
    if not code.exists():
        code.mkdir(parents=True)
        archive = subprocess.run(["git", "archive", ref], cwd=HERE.parent, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(code)], input=archive, check=True)
    copy = Job(rows, f"-before-{ref}")
    if not copy.finished():
        shutil.rmtree(copy.dir, ignore_errors=True)
        copy.dir.mkdir(parents=True)
        for name in ("home", "dagster"):
            shutil.copytree(job.dir / name, copy.dir / name)
        copy.spec.write_text(job.spec.read_text())
    return copy, code


def pause(job: Job) -> None:
    """``batch-pipeline pause``'s record: the next run lifts it, so it has something to do (the ordinary run)."""
    from batch_pipeline.core.ledger.control import JobControl
    from batch_pipeline.core.store import Store

    JobControl(Store(job.home), JOB).pause("noop_run_bench")


def measure(job: Job, url: str, repeat: int, before: tuple[Job, Path] | None) -> dict[str, list[dict]]:
    """``repeat`` rounds, the variants interleaved: the no-op run (and the code before, on its copy of the job),
    ``--help`` and the imports an ordinary run makes."""
    cli = [sys.executable, "-m", "batch_pipeline.cli"]
    variants: dict[str, tuple[list[str], dict[str, str]]] = {
        "run": ([*cli, "run", str(job.spec)], job.env(url)),
        "paused": ([*cli, "run", str(job.spec)], job.env(url)),  # paused first: run lifts it, the manifest runs
        "help": ([*cli, "--help"], job.env(url)),
        "imports": ([sys.executable, "-c", IMPORTS], job.env(url)),
    }
    if before is not None:
        copy, code = before
        variants["before"] = ([*cli, "run", str(copy.spec)], copy.env(url, code))
    for name in ("run", "before"):  # a job built before the publish basis existed publishes once here
        if name in variants:
            first = timed(*variants[name])
            print(f"  first {name} after the build: {first['wall_s']:.2f} s wall, {first['cpu_s']:.2f} s CPU")
    runs: dict[str, list[dict]] = {name: [] for name in variants}
    for i in range(repeat):
        for name, (cmd, env) in variants.items():
            if name == "paused":
                pause(job)
            r = timed(cmd, env)
            if r["code"] != 0:
                raise SystemExit(f"{name} exited {r['code']}:\n{r['out'][-3000:]}")
            runs[name].append(r)
            print(
                f"  round {i + 1} {name:8s} {r['wall_s']:6.2f} s wall, {r['cpu_s']:6.2f} s CPU, "
                f"peak RSS {r['rss_mb']:6.0f} MB, load {load():.1f}",
                flush=True,
            )
    return runs


def importtime(job: Job, env: dict[str, str], name: str, imports: str) -> None:
    """``-X importtime`` of ``imports`` (written to ``importtime-<name>.txt``), its largest cumulative entries."""
    text = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", imports], env=env, cwd=OUT, capture_output=True, text=True
    ).stderr
    (job.dir / f"importtime-{name}.txt").write_text(text)
    rows = []
    for line in text.splitlines():
        parts = line.removeprefix("import time:").split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            rows.append((int(parts[1]), parts[2].rstrip()))
    print(f"importtime of {name} ({imports}), the largest cumulative (us, module):")
    for us, module in sorted(rows, reverse=True)[:15]:
        print(f"  {us:>9,}  {module}")


def profile(job: Job, url: str) -> None:
    """``-X importtime`` of what the no-op run and an ordinary run import, and a cProfile of
    ``cli.main(["run", spec])`` in-process."""
    env = job.env(url)
    importtime(job, env, "noop", NOOP_IMPORTS)
    importtime(job, env, "ordinary", IMPORTS)
    code = (
        "import cProfile, pstats, sys; from batch_pipeline.cli import main; "
        f"p = cProfile.Profile(); p.enable(); rc = main(['run', {str(job.spec)!r}]); p.disable(); "
        f"p.dump_stats({str(job.dir / 'run.prof')!r}); "
        "s = pstats.Stats(p, stream=sys.stderr); s.sort_stats('cumulative').print_stats(60); sys.exit(rc)"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=OUT, capture_output=True, text=True, check=False)
    (job.dir / "run_profile.txt").write_text(done.stderr)
    print(f"cProfile of the run (exit {done.returncode}) in {job.dir / 'run_profile.txt'}; top of it:")
    print("\n".join(done.stderr.splitlines()[:80]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=537_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="also -X importtime and a cProfile of one run")
    ap.add_argument("--before", metavar="REF", help="also time the code at this git ref, on a copy of the job")
    args = ap.parse_args(argv)
    job = Job(args.rows)
    if not job.finished():
        from batch_pipeline.sandbox import start_sandbox_process, stop_sandbox_process

        proc, url = start_sandbox_process(0)
        try:
            build(job, args.rows, url)
        finally:
            stop_sandbox_process(proc)
    print(f"no-op run of the finished job {job.spec} (load {load():.1f}):", flush=True)
    before = before_copy(job, args.rows, args.before) if args.before else None
    runs = measure(job, CLOSED_PORT, args.repeat, before)
    if args.profile:
        profile(job, CLOSED_PORT)
    report = json.loads(job.report.read_text())
    print(
        f"job: {report.get('unique_requests'):,} items in {report.get('shards')} shards, "
        f"{report.get('succeeded'):,} answered, new input rows this run {report.get('new_input_rows')}"
    )
    for name, rs in runs.items():
        print(
            f"  {name:8s} median {_median(rs, 'wall_s'):.2f} s wall (min {min(r['wall_s'] for r in rs):.2f}), "
            f"{_median(rs, 'cpu_s'):.2f} s CPU, peak RSS {_median(rs, 'rss_mb'):,.0f} MB"
        )
    own = _median(runs["run"], "wall_s") - _median(runs["help"], "wall_s")
    print(
        f"  the run beyond the CLI's start (--help): {own:.2f} s; target < 4 s for the run: "
        f"{'met' if _median(runs['run'], 'wall_s') < 4 else 'NOT met'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
