"""`batch-pipeline` processes for tests, forked from a server that has already imported what the CLI imports.

A cold `python -m batch_pipeline.cli run` spends ~3.5 of its ~7.5 CPU seconds on a small job importing Dagster, the
SDKs, Polars, DuckDB, pandera and matplotlib, and the suite starts dozens of them (the kill tests, the crash tests,
the CLI tests). Here each one is a fork of a process that did those imports once: a real process with its own pid,
environment, working directory and output pipes, killed for real (``BATCH_PIPELINE_CRASH_AT`` SIGKILLs it, a test
SIGTERMs it), which runs ``batch_pipeline.cli.main`` as ``python -m batch_pipeline.cli`` does and exits with its
code. The tests that are about a cold start (``test_cli_procs``, the `dg` project, the sandbox CLI, the vLLM tier)
still start the interpreter.

Safe to fork: the server only imports, and builds the BPE encodings a run of an OpenAI model counts with (read-only
tables, like the modules). No Python thread runs (it checks before it serves); the native ones the imports start
hold no lock while idle and are made again in the child (jemalloc's background threads, which jemalloc re-arms at
fork; Arrow's pools, which Arrow rebuilds after a fork; Polars' spill cleaner). Polars' and DuckDB's worker pools
start on first use, so in the child. Nothing in ``batch_pipeline`` reads the environment when imported
(``test_settings`` asserts it), so each child takes the environment it is given. tiktoken keeps no thread of its own.
Its SIGINT, SIGQUIT, SIGTERM and SIGHUP are as a cold start by the client would have them: ignored where the client
ignores them (exec keeps an ignored signal), else at their defaults, whatever the server's are.

Run as ``python -m batch_pipeline_tests.cli_forks SOCKET``: one request per connection on the Unix socket: a JSON
request with the child's stdout and stderr file descriptors; the answer is two lines: its pid (from the child), then
its exit code (from the server: ``-N`` for signal N, as ``subprocess`` reports it).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from batch_pipeline_tests.gcs_fixtures import stop_process

PRELOAD = (
    "dagster",
    "dagster._core.instance.factory",  # what making a $DAGSTER_HOME instance imports
    "dagster._core.storage.sqlite_storage",
    "dagster._core.workspace",
    "dagster._daemon",
    "dagster._grpc",
    "alembic.command",
    "alembic.config",
    "sqlalchemy.dialects.sqlite",
    "rich.traceback",
    "batch_pipeline.cli",
    "batch_pipeline.defs.pipeline",
    "batch_pipeline.executors.openai.batch",
    "batch_pipeline.executors.anthropic.batch",
    "batch_pipeline.executors.google.gemini_batch",
    "batch_pipeline.executors.google.vertex_batch",
    "batch_pipeline.executors.bedrock.batch",
    "batch_pipeline.executors.online.executor",
    "pandera.pandas",
    "pyarrow.dataset",
    "matplotlib.pyplot",
    # what a run still imported after the fork (`python -X importtime`, a demo run: ~150 ms a child)
    "pandera.backends.pandas.builtin_checks",  # its strategies import hypothesis (74 ms)
    "pandera.backends.pandas.register",
    "upath",
    "httpcore2",
    "openai.resources.files",
    "openai.resources.batches",
    "rich._emoji_codes",
    "dagster._core.secrets.env_file",
    "dagster._core.instance.runs.run_domain",
    "dagster._core.execution.execute_in_process",
    "matplotlib.backends.backend_agg",
)
# BPE encodings every run of an OpenAI model builds from the bundled ranks (~0.3 CPU s each): an immutable table,
# as a module is, so it is built once here (``batch_pipeline.bpe.encoding`` is cached)
PRELOAD_ENCODINGS = ("o200k_base",)
HEADER = struct.Struct("!I")
CHILD_SIGNALS = (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGHUP)
READY = "ready"


# -- the server ---------------------------------------------------------------------------------------------------
def _preload() -> None:
    import importlib

    import matplotlib

    matplotlib.use("Agg")  # what core/publish/plots.py selects before it imports pyplot
    for name in PRELOAD:
        importlib.import_module(name)
    from batch_pipeline.bpe import encoding

    for name in PRELOAD_ENCODINGS:
        encoding(name)
    if threading.active_count() != 1:
        raise SystemExit(f"cli_forks: {threading.enumerate()} after the imports; forking would be unsafe")


def _read_request(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 2)
    while len(data) < HEADER.size or len(data) < HEADER.size + HEADER.unpack_from(data)[0]:
        more = conn.recv(1 << 16)
        if not more:
            raise EOFError("the request was cut short")
        data += more
    (size,) = HEADER.unpack_from(data)
    return json.loads(data[HEADER.size : HEADER.size + size]), list(fds)


def _child(request: dict[str, Any], fds: list[int], conn: socket.socket) -> None:
    """In the fork: become `python -m batch_pipeline.cli ARGS` in the requested place, then exit with its code.
    It tells its pid itself, once it leads its session if it was asked to (the server tells its exit code)."""
    code = 1
    try:
        if request["new_session"]:
            os.setsid()
        conn.sendall(f"{os.getpid()}\n".encode())
        conn.close()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for fd in {devnull, *fds}:
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for sig in CHILD_SIGNALS:  # as a fresh interpreter started by the client has them, not as the server has
            default = signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL
            signal.signal(sig, signal.SIG_IGN if int(sig) in request["ignored"] else default)
        sys.path[0] = request["cwd"]  # `python -m` puts the working directory first
        from batch_pipeline import cli

        sys.argv = [cli.__file__, *request["args"]]  # what `python -m batch_pipeline.cli` sees
        code = cli.main(request["args"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()  # what the interpreter's exit would run
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve(path: str) -> None:
    _preload()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    print(READY, flush=True)
    waiting: dict[int, socket.socket] = {}  # child pid -> the connection that asked for it
    while True:
        for _ in selector.select(timeout=0.02):
            conn, _ = listener.accept()
            try:
                request, fds = _read_request(conn)
            except (OSError, EOFError, ValueError):
                conn.close()
                continue
            pid = os.fork()
            if pid == 0:
                selector.close()
                listener.close()
                _child(request, fds, conn)
            for fd in fds:
                os.close(fd)
            waiting[pid] = conn
        while waiting:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = waiting.pop(pid, None)
            if conn is not None:
                try:
                    conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
                except OSError:
                    pass  # the test is gone
                conn.close()


# -- the client ---------------------------------------------------------------------------------------------------
class ForkedCli:
    """One forked `batch-pipeline` process, with the part of ``subprocess.Popen``'s surface the tests use."""

    def __init__(
        self,
        socket_path: str,
        args: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str | os.PathLike | None = None,
        stderr_to_stdout: bool = False,
        output: IO | None = None,
        start_new_session: bool = False,
    ) -> None:
        """``output``: a file both streams go to (no pipes); else stdout is a pipe, and stderr another one or, with
        ``stderr_to_stdout``, the same."""
        self.args = list(args)
        self.returncode: int | None = None
        if output is not None:
            out_r, err_r, out_w, err_w = None, None, os.dup(output.fileno()), os.dup(output.fileno())
        else:
            out_r, out_w = os.pipe()
            err_r, err_w = (None, os.dup(out_w)) if stderr_to_stdout else os.pipe()
        request = {
            "args": self.args,
            "env": dict(os.environ if env is None else env),
            "cwd": str(Path(cwd or os.getcwd()).resolve()),
            "new_session": start_new_session,
            # what a started process inherits through exec: the signals this one ignores (a script's `cmd &`)
            "ignored": [int(s) for s in CHILD_SIGNALS if signal.getsignal(s) is signal.SIG_IGN],
        }
        payload = json.dumps(request).encode()
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._conn.connect(socket_path)
            socket.send_fds(self._conn, [HEADER.pack(len(payload)) + payload], [out_w, err_w])
        finally:
            os.close(out_w)
            os.close(err_w)
        self._buffer = b""
        self.pid = int(self._line(None) or -1)
        self.stdout: IO[str] | None = None if out_r is None else open(out_r, encoding="utf-8", errors="replace")  # noqa: SIM115
        self.stderr: IO[str] | None = None if err_r is None else open(err_r, encoding="utf-8", errors="replace")  # noqa: SIM115

    def _line(self, timeout: float | None) -> str | None:
        """The server's next answer line, or None when none came within ``timeout`` (None: wait for it)."""
        while b"\n" not in self._buffer:
            if not select.select([self._conn], [], [], timeout)[0]:
                return None
            more = self._conn.recv(4096)
            if not more:
                raise RuntimeError(f"the CLI fork server closed the connection of {self.args}")
            self._buffer += more
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def poll(self) -> int | None:
        if self.returncode is None:
            self._ended(0)
        return self.returncode

    def _ended(self, timeout: float | None) -> bool:
        line = self._line(timeout)
        if line is not None:
            self.returncode = int(line)
            self._conn.close()
        return self.returncode is not None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None and not self._ended(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        assert self.returncode is not None
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Read both outputs to their end and wait, as ``Popen.communicate`` does; on timeout the process is killed."""
        chunks: dict[str, list[str]] = {"out": [], "err": []}
        readers = [
            threading.Thread(target=lambda f=f, to=to: chunks[to].append(f.read()), daemon=True)
            for f, to in ((self.stdout, "out"), (self.stderr, "err"))
            if f is not None
        ]
        for r in readers:
            r.start()
        try:
            self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.wait()
            raise
        for r in readers:
            r.join()
        for f in (self.stdout, self.stderr):
            if f is not None:
                f.close()
        return "".join(chunks["out"]), "".join(chunks["err"])

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(15)

    def kill(self) -> None:
        self.send_signal(9)


class CliForks:
    """The fork server of one test process (started by the ``cli`` fixture, stopped by its PID)."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path

    def popen(self, args: Sequence[str], **kwargs: Any) -> ForkedCli:
        """``batch-pipeline ARGS`` started; stdout is a pipe (with stderr in it when ``stderr_to_stdout``)."""
        return ForkedCli(self.socket_path, args, **kwargs)

    def run(
        self,
        args: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str | os.PathLike | None = None,
        timeout: float | None = None,
    ) -> subprocess.CompletedProcess:
        """``batch-pipeline ARGS`` to its end, as ``subprocess.run(..., capture_output=True, text=True)``."""
        proc = self.popen(args, env=env, cwd=cwd)
        out, err = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess([*proc.args], proc.wait(), out, err)


@contextmanager
def cli_fork_server(directory: Path, start_timeout_s: float = 120.0) -> Iterator[CliForks]:
    """Start the fork server (its imports take a few seconds), yield its client; stop it by PID."""
    path = str(directory / "cli.sock")
    proc = subprocess.Popen(
        [sys.executable, "-m", "batch_pipeline_tests.cli_forks", path],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    try:
        assert proc.stdout is not None
        stdout = proc.stdout
        ready = threading.Event()
        threading.Thread(target=lambda: stdout.readline().strip() == READY and ready.set(), daemon=True).start()
        deadline = time.monotonic() + start_timeout_s
        while not ready.wait(0.1):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the CLI fork server did not start (exit code {proc.returncode})")
        yield CliForks(path)
    finally:
        stop_process(proc)


if __name__ == "__main__":
    serve(sys.argv[1])
