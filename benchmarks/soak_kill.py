"""Soak: SIGKILL a real `batch-pipeline run` at random moments across a large job, then finish it; count what was
lost and what was paid twice.

A 20,000-item job (``--items``) on the OpenAI batch path of the sandbox, in shards of 500, with the sandbox's
``line_errors`` scenario (5% of lines fail with a 500 the first time, so retries happen) and a slow batch
window (``--in-progress-s``). Runs are killed after a random 1-``--max-wait`` seconds until ``--kills`` kills have
landed on live work (a run that finishes the job ends the series; the moment
lands wherever it lands: mid-create, mid-poll, mid-download, between parts, mid-publish); then one last run goes to
the end. From the sandbox's ledger and the store it prints: items lost (not valid and not dead-lettered), requests
billed twice, batches created, and the validated table's row count against the input's.

    python benchmarks/soak_kill.py --items 20000 --kills 20
"""

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import polars as pl
import yaml

from batch_pipeline.core.publish.tables import JobState
from batch_pipeline.core.spec.loading import load_spec
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline.sandbox import SandboxAdmin, start_sandbox_process, stop_sandbox_process

REPO = Path(__file__).resolve().parents[1]
WORDS = ["invoice", "charged", "twice", "crash", "login", "password", "refund", "feature", "export", "slow"]


def write_job(root: Path, items: int, seed: int, shard_size: int) -> Path:
    rng = random.Random(seed)
    inputs = root / "data" / "in"
    inputs.mkdir(parents=True)
    with open(inputs / "rows.jsonl", "w", encoding="utf-8") as out:
        for i in range(items):
            body = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 40)))
            out.write(json.dumps({"ticket_id": f"T{i}", "subject": "ticket", "body": f"{i}: {body}"}) + "\n")
    spec = yaml.safe_load((REPO / "data" / "jobs" / "demo.yaml").read_text())
    spec.pop("quality", None)
    spec.update(
        name="soak",
        input={**spec["input"], "path": str(inputs / "*.jsonl")},
        shards={"max_requests": shard_size},
        retries={"per_item": 3, "spend_cap_share": 1.0},
        budget_usd=100,
    )
    (root / "data" / "jobs").mkdir(parents=True)
    path = root / "data" / "jobs" / "soak.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def run_cli(spec_path: Path, home: Path, dagster_home: Path, url: str) -> subprocess.Popen:
    env = {**os.environ, "DAGSTER_HOME": str(dagster_home), "BATCH_PIPELINE_SANDBOX_URL": url}
    return subprocess.Popen(
        [sys.executable, "-m", "batch_pipeline.cli", "run", str(spec_path), "--home", str(home)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--max-wait", type=float, default=12.0, help="longest a run lives before its SIGKILL (s)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--in-progress-s", type=float, default=8.0, help="the sandbox's batch window (slow)")
    parser.add_argument("--shard-size", type=int, default=500)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        root = Path(tmp)
        spec_path = write_job(root, args.items, args.seed, args.shard_size)
        home, dagster_home = root / "home", root / "dagster_home"
        dagster_home.mkdir()
        proc, url = start_sandbox_process(0)
        try:
            admin = SandboxAdmin(url)
            admin.set_scenario("line_errors", rate=0.05, times=1, in_progress_s=args.in_progress_s)
            started = time.monotonic()
            killed_alive = n = 0
            while killed_alive < args.kills:  # kills land on live work only: stop when a run finishes the job
                n += 1
                run = run_cli(spec_path, home, dagster_home, url)
                wait = rng.uniform(1.0, args.max_wait)
                try:
                    run.wait(timeout=wait)  # a run that finishes early is not killed
                except subprocess.TimeoutExpired:
                    run.send_signal(signal.SIGKILL)
                    run.wait()
                    killed_alive += 1
                print(
                    f"run {n:2d}: {'killed' if run.returncode == -signal.SIGKILL else f'exit {run.returncode}'} "
                    f"after {wait:4.1f} s; {len(admin.ledger()):6,d} requests billed so far",
                    flush=True,
                )
                if run.returncode == 0:
                    break
            final = run_cli(spec_path, home, dagster_home, url)
            final.wait(timeout=1800)
            wall = time.monotonic() - started
            spec = load_spec(spec_path)
            store = Store(home)
            state = JobState.load(spec, store)
            counts = state.check()
            billed = Counter(e["custom_id"] for e in admin.ledger())
            twice = sum(1 for v in billed.values() if v > 1)
            creates = sum(
                1
                for r in admin.requests()
                if r["method"] == "POST" and r["path"] == "/v1/batches" and r["status"] == 200
            )
            rows = state.items.height
            validated = pl.read_parquet(store.read_bytes(JobPaths(spec.name).validated)).height
            lost = counts.expected - counts.valid - counts.dead_lettered
            print(
                f"\nsoak: {args.items:,} rows, {rows:,} unique items, {killed_alive} SIGKILLs, final run exit "
                f"{final.returncode}, {wall:.0f} s in all"
            )
            print(f"  items lost (neither valid nor dead-lettered): {lost}")
            print(f"  requests billed twice: {twice} (of {len(billed):,} billed)")
            print(f"  valid {counts.valid:,}, dead-lettered {counts.dead_lettered:,}, batches created {creates}")
            print(f"  validated table rows {validated:,} for {args.items:,} input rows")
            if lost or twice or final.returncode != 0:
                sys.exit(1)
        finally:
            stop_sandbox_process(proc)


if __name__ == "__main__":
    main()
