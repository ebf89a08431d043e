"""`batch-pipeline dev` and `batch-pipeline sandbox` stop everything they started on SIGTERM, as on Ctrl-C."""

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _wait(predicate, timeout: float, what: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, f"{what}: the command exited with {proc.returncode}"
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.2)


def _start(args: list[str], tmp_path: Path) -> subprocess.Popen:
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "dh"), "BATCH_PIPELINE_HOME": str(tmp_path / "home")}
    env.pop("BATCH_PIPELINE_SANDBOX_URL", None)
    return subprocess.Popen(
        [sys.executable, "-m", "batch_pipeline.cli", *args],
        env=env,
        cwd=tmp_path,
        stdout=open(tmp_path / "out.txt", "w"),
        stderr=subprocess.STDOUT,
    )


def _stop_and_check(proc: subprocess.Popen, ports: list[int], sig: signal.Signals, timeout: float = 60) -> None:
    started = {c.pid: c for c in psutil.Process(proc.pid).children(recursive=True)}
    try:
        os.kill(proc.pid, sig)
        assert proc.wait(timeout=timeout) == 0
        gone, alive = psutil.wait_procs(list(started.values()), timeout=5)
        assert not alive, [(p.pid, p.cmdline()) for p in alive]
        for port in ports:
            assert not _listening(port), port
    finally:
        for child in [proc, *started.values()]:  # stop, by PID, whatever a failure left
            try:
                child.kill()
            except (psutil.NoSuchProcess, ProcessLookupError):
                pass
        proc.wait(timeout=10)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sandbox_stops_its_server_on_a_signal(tmp_path, sig):
    port = _free_port()
    proc = _start(["sandbox", "--port", str(port)], tmp_path)
    _wait(lambda: _listening(port), 30, "the sandbox listens", proc)
    _stop_and_check(proc, [port], sig)


def test_dev_stops_dagster_dev_its_children_and_the_sandbox_on_sigterm(tmp_path):
    port = _free_port()
    proc = _start(["dev", "--port", str(port)], tmp_path)
    out = tmp_path / "out.txt"
    _wait(lambda: _listening(port), 180, "dagster dev's webserver listens", proc)
    sandbox_port = int(re.search(r"http://127\.0\.0\.1:(\d+)", out.read_text()).group(1))
    assert _listening(sandbox_port)
    children = psutil.Process(proc.pid).children(recursive=True)
    assert len(children) >= 3, [c.cmdline() for c in children]  # the sandbox, dagster dev, and what it started
    _stop_and_check(proc, [port, sandbox_port], signal.SIGTERM)
    assert "stopping dagster dev" in out.read_text()
