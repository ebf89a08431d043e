"""A loopback GCS emulator (``gcp-storage-emulator``) and a sandbox process that uses it, for the Vertex tests.

Imported by the root conftest: one emulator and one such sandbox per test worker, the emulator wiped at each test
module's start and the sandbox reset by each test. The emulator is a real HTTP server on a free 127.0.0.1 port, in
memory, stopped by PID; the sandbox reads Vertex inputs from it and writes predictions to it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from batch_pipeline.sandbox import SandboxAdmin, start_sandbox_process, stop_sandbox_process

EMULATOR = Path(sys.executable).with_name("gcp-storage-emulator")
GOOGLE_ENV = (
    "GOOGLE_CLOUD_PROJECT",
    "GOOGLE_CLOUD_LOCATION",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GOOGLE_GENAI_API_VERSION",
    "GOOGLE_API_KEY",
    "GEMINI_API_KEY",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_gcs_emulator(timeout: float = 20.0) -> tuple[subprocess.Popen[bytes], str]:
    """``gcp-storage-emulator start --in-memory`` on a free loopback port; returns (process, URL) once it answers."""
    port = _free_port()
    proc = subprocess.Popen(
        [str(EMULATOR), "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory", "-q"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url + "/storage/v1/b", timeout=1).read()
            return proc, url
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.05)
    stop_process(proc)
    raise RuntimeError(f"the GCS emulator did not answer on {url}")


def stop_process(proc: subprocess.Popen[bytes], grace_s: float = 2.0) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``: the emulator and the CLI fork server hold nothing to save. Both once
    outlived their SIGTERM at the end of whole suites, started by a worker that ignored it (the root conftest's
    ``pytest_configure`` says why); should one again, a warning gives its signal state."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            state = _signal_state(proc.pid)
            warnings.warn(f"pid {proc.pid} ({proc.args!r}) outlived SIGTERM by {grace_s} s: {state}", stacklevel=2)
            proc.kill()
            proc.wait(timeout=5)


def _signal_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/status") as status:
            return ", ".join(line.strip() for line in status if line.startswith(("State", "Threads", "Sig")))
    except OSError as exc:
        return f"no status ({exc})"


@pytest.fixture(scope="session")
def gcs_emulator_proc() -> Iterator[str]:
    """One emulator per test worker (a start is an interpreter and Google's storage imports): its URL."""
    proc, url = start_gcs_emulator()
    try:
        yield url
    finally:
        stop_process(proc)


def wipe_gcs_emulator(url: str) -> None:
    """Drop every bucket and object of the emulator (its ``/wipe`` route)."""
    with urllib.request.urlopen(url + "/wipe", timeout=30) as answer:
        if answer.read() != b"OK":
            raise RuntimeError(f"the GCS emulator on {url} did not wipe its data")


@pytest.fixture(scope="module")
def gcs_emulator(gcs_emulator_proc: str) -> str:
    """The worker's emulator (``http://127.0.0.1:PORT``), emptied for this test module: a module starts with no
    bucket, as it did when each module started its own."""
    wipe_gcs_emulator(gcs_emulator_proc)
    return gcs_emulator_proc


@pytest.fixture(scope="session")
def vertex_sandbox_proc(gcs_emulator_proc: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A sandbox process that knows the emulator (``STORAGE_EMULATOR_HOST``), one per test worker: yields
    ``(proc, url)``. Every test that uses it resets it first, through ``vertex_sandbox``."""
    proc, url = start_sandbox_process(port=0, env={"STORAGE_EMULATOR_HOST": gcs_emulator_proc})
    try:
        yield proc, url
    finally:
        stop_sandbox_process(proc)


@pytest.fixture
def vertex_sandbox(vertex_sandbox_proc, gcs_emulator: str, monkeypatch) -> SandboxAdmin:
    """That sandbox, reset for this test, wired in through $BATCH_PIPELINE_SANDBOX_URL and $STORAGE_EMULATOR_HOST,
    with no Google project, credentials or key of the environment in reach."""
    _, url = vertex_sandbox_proc
    admin = SandboxAdmin(url, timeout=60.0)  # 10 s timed out on a loaded machine
    admin.reset()
    monkeypatch.setenv("BATCH_PIPELINE_SANDBOX_URL", url)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator)
    for name in GOOGLE_ENV:
        monkeypatch.delenv(name, raising=False)
    return admin


def vertex_creates(admin: SandboxAdmin) -> int:
    """Batch prediction jobs the sandbox created (accepted POSTs to the collection)."""
    return sum(
        1
        for r in admin.requests()
        if r["method"] == "POST" and r["path"].endswith("/batchPredictionJobs") and r["status"] == 200
    )


def emulator_env(url: str) -> dict[str, str]:
    """The environment a child process needs to reach the emulator."""
    return {**os.environ, "STORAGE_EMULATOR_HOST": url}
