"""Fixtures for the e2e tier: a temp project, `dagster dev` as a real subprocess on loopback, a GraphQL client.

`dagster dev` runs in its own session (process group); at teardown it is stopped by PID: SIGTERM to its
group, a wait, SIGKILL to whatever is left. Every process it spawned (webserver, daemon, code servers,
run workers) is recorded with psutil while it runs, and the teardown fails if any of them survived.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests
import yaml

from batch_pipeline.sandbox import SandboxAdmin

from ..defs.postgres import PostgresServer, postgres_server

REPO = Path(__file__).resolve().parents[2]
SMALL = REPO / "data" / "samples" / "tickets_small" / "tickets.jsonl"
JOB = "e2e"
LOCATION = "batch_pipeline"
REPOSITORY = "__repository__"  # the repository of a module-level dg.Definitions
STARTUP_TIMEOUT_S = 120.0  # bounds, not timings: a slow CI machine must not fail a correct run
STOP_TIMEOUT_S = 5.0  # dagster dev (1.13) does not exit on SIGTERM in 30 s: its group is SIGKILLed after this


@dataclass(frozen=True)
class Project:
    root: Path
    jobs_dir: Path
    spec_path: Path
    dagster_home: Path
    home: Path  # BATCH_PIPELINE_HOME


def write_project(root: Path, input_path: str, **overrides: Any) -> Project:
    """A project under `root`: one job spec `e2e` (the demo's, 10 requests per shard, `input.path` =
    `input_path`, then `overrides`), the repo's dagster.yaml in an empty DAGSTER_HOME, an empty store home."""
    spec = yaml.safe_load((REPO / "data" / "jobs" / "demo.yaml").read_text())
    spec.update(name=JOB, input={**spec["input"], "path": input_path}, shards={"max_requests": 10})
    spec.pop("quality", None)  # no golden probes: the ledger holds exactly the job's requests
    spec.update(overrides)
    jobs_dir = root / "jobs"
    jobs_dir.mkdir()
    spec_path = jobs_dir / f"{JOB}.yaml"
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    dagster_home = root / "dagster_home"
    dagster_home.mkdir()
    shutil.copy(REPO / "dagster.yaml", dagster_home / "dagster.yaml")
    home = root / "home"
    home.mkdir()
    return Project(root, jobs_dir, spec_path, dagster_home, home)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class GraphQL:
    """A minimal GraphQL-over-HTTP client for one `dagster dev` (raises on transport and GraphQL errors)."""

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        self.url = url
        self.timeout = timeout
        self.session = requests.Session()

    def __call__(self, query: str, **variables: Any) -> dict[str, Any]:
        resp = self.session.post(self.url, json={"query": query, "variables": variables}, timeout=self.timeout)
        resp.raise_for_status()
        body = resp.json()
        if body.get("errors"):
            raise AssertionError(f"GraphQL errors: {body['errors']}")
        return body["data"]


@dataclass
class DagsterDev:
    proc: subprocess.Popen
    port: int
    gql: GraphQL
    log_path: Path
    sandbox: SandboxAdmin
    project: Project
    seen: dict[int, psutil.Process]

    def watch(self) -> None:
        """Record the processes `dagster dev` has spawned so far (run workers come and go: call this often)."""
        self.seen.update(_descendants(self.proc.pid))

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def _descendants(pid: int) -> dict[int, psutil.Process]:
    try:
        return {p.pid: p for p in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return {}


def _alive(procs: dict[int, psutil.Process]) -> list[str]:
    out = []
    for p in procs.values():
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{p.pid} {' '.join(p.cmdline())[:200]}")
        except psutil.NoSuchProcess:
            pass
    return out


def _with_dagster_home(dagster_home: Path) -> dict[int, psutil.Process]:
    """Every live process whose environment has our DAGSTER_HOME: all that `dagster dev` spawned inherit it."""
    found = {}
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and p.environ().get("DAGSTER_HOME") == str(dagster_home):
                found[p.pid] = p
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            pass
    return found


def _stop(proc: subprocess.Popen, seen: dict[int, psutil.Process]) -> list[str]:
    """SIGTERM the process group of `proc` (by its PID), wait; then SIGKILL the group and any stragglers.

    Returns the processes that had to be SIGKILLed (a graceful shutdown leaves none)."""
    seen.update(_descendants(proc.pid))
    pgid = proc.pid  # start_new_session=True: the leader's PID is the group's ID
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + STOP_TIMEOUT_S
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pass
    # its children share the deadline to finish their own shutdown
    _, still = psutil.wait_procs(
        [p for p in seen.values() if p.is_running()], timeout=max(deadline - time.monotonic(), 0.1)
    )
    killed = _alive({p.pid: p for p in still}) + ([f"{proc.pid} dagster dev"] if proc.poll() is None else [])
    if killed:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for p in still:  # a descendant that left the group (its own session) is killed by its PID
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        proc.wait(timeout=5)
        psutil.wait_procs(still, timeout=5)
    return killed


@contextmanager
def run_dagster_dev(
    sandbox_url: str,
    project: Project,
    extra_env: dict[str, str] | None = None,
    workspace: Path = REPO / "workspace.yaml",
) -> Iterator[DagsterDev]:
    """`python -m dagster dev` on a free loopback port, on `project` (environment + `extra_env`, code locations
    from `workspace`); yields once GraphQL answers. On exit: stopped by PID, and fails if any process it
    spawned is still alive."""
    admin = SandboxAdmin(sandbox_url)
    admin.reset()
    port = free_port()
    env = {
        **os.environ,
        "DAGSTER_HOME": str(project.dagster_home),
        "BATCH_PIPELINE_HOME": str(project.home),
        "BATCH_PIPELINE_JOBS": str(project.jobs_dir),
        "BATCH_PIPELINE_SANDBOX_URL": sandbox_url,
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
        "DAGSTER_DISABLE_TELEMETRY": "1",
        **(extra_env or {}),
    }
    log_path = project.root / "dagster_dev.log"
    log = log_path.open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dagster", "dev", "-h", "127.0.0.1", "-p", str(port), "-w", str(workspace)],
        env=env,
        cwd=project.root,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    seen: dict[int, psutil.Process] = {}
    dev = DagsterDev(proc, port, GraphQL(f"http://127.0.0.1:{port}/graphql"), log_path, admin, project, seen)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            assert proc.poll() is None, f"dagster dev exited with {proc.returncode}:\n{dev.log_tail()}"
            dev.watch()
            try:
                if dev.gql("{ version }").get("version"):
                    break
            except (requests.RequestException, AssertionError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"dagster dev did not answer GraphQL within {STARTUP_TIMEOUT_S} s:\n{dev.log_tail()}"
                )
            time.sleep(0.25)
        yield dev
    finally:
        seen.update(_descendants(proc.pid))
        killed = _stop(proc, seen)
        log.close()
    if killed:
        warnings.warn(
            f"dagster dev did not shut down on SIGTERM within {STOP_TIMEOUT_S} s; SIGKILLed: {killed}", stacklevel=1
        )
    late = {pid: q for pid, q in _with_dagster_home(project.dagster_home).items() if pid not in seen}
    if late:  # spawned while it shut down (its proxy manager restarts a code server that exits): stopped by PID
        warnings.warn(
            f"dagster dev started processes during its shutdown; stopped by PID: {_alive(late)}", stacklevel=1
        )
        for q in late.values():
            try:
                q.terminate()
            except psutil.NoSuchProcess:
                pass
        _, still = psutil.wait_procs(list(late.values()), timeout=STOP_TIMEOUT_S)
        for q in still:
            try:
                q.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(still, timeout=STOP_TIMEOUT_S)
        seen.update(late)
    left = _alive({**seen, **_with_dagster_home(project.dagster_home)})
    assert proc.returncode is not None
    assert not left, f"dagster dev left processes behind: {left}\n{dev.log_tail()}"


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """Debian's PostgreSQL on a free loopback port (one per test process), stopped by PID at the end."""
    with postgres_server() as server:
        yield server
