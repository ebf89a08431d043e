"""Running the sandbox as a child process (for tests and the CLI)."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

READY_PREFIX = "SANDBOX READY "
_REPO_ROOT = str(Path(__file__).resolve().parents[2])


def start_sandbox_process(
    port: int = 0,
    env: Mapping[str, str] | None = None,
    *,
    args: Sequence[str] = (),
    timeout: float = 20.0,
) -> tuple[subprocess.Popen[str], str]:
    """Launch ``python -m batch_pipeline.sandbox --port PORT [args]`` and wait for its READY line.

    ``env`` is added to the current environment. Returns the process and its base url (``http://127.0.0.1:N``);
    stop it with ``stop_sandbox_process``. Raises RuntimeError if it does not become ready within ``timeout``.
    """
    child_env = dict(os.environ)
    child_env.update(env or {})
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (_REPO_ROOT, child_env.get("PYTHONPATH", "")) if p)
    command = [sys.executable, "-m", "batch_pipeline.sandbox", "--port", str(port), *args]
    proc = subprocess.Popen(command, env=child_env, stdout=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()

    def read_first_line() -> None:
        assert proc.stdout is not None
        lines.put(proc.stdout.readline())

    threading.Thread(target=read_first_line, daemon=True).start()
    try:
        line = lines.get(timeout=timeout)
    except queue.Empty:
        stop_sandbox_process(proc)
        raise RuntimeError(f"sandbox did not print its READY line within {timeout} s") from None
    if not line.startswith(READY_PREFIX):
        stop_sandbox_process(proc)
        raise RuntimeError(f"sandbox failed to start (exit code {proc.returncode}); first line: {line!r}")
    return proc, line[len(READY_PREFIX) :].strip()


def stop_sandbox_process(proc: subprocess.Popen[str], timeout: float = 5.0) -> int:
    """Terminate the process by its PID (SIGTERM, then SIGKILL after ``timeout``); returns its exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)
    if proc.stdout is not None:
        proc.stdout.close()
    return int(proc.returncode)
