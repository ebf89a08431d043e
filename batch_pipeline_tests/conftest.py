"""Shared pytest fixtures."""

from __future__ import annotations

import gc
import signal
from collections.abc import Iterator
from subprocess import Popen

import pytest

from batch_pipeline.process_exit import no_collection_at_exit
from batch_pipeline.sandbox import SandboxAdmin, start_sandbox_process, stop_sandbox_process
from batch_pipeline_tests import file_order
from batch_pipeline_tests.cli_forks import CliForks, cli_fork_server
from batch_pipeline_tests.gcs_fixtures import (  # noqa: F401  (fixtures: one emulator and Vertex sandbox per worker)
    gcs_emulator,
    gcs_emulator_proc,
    vertex_sandbox,
    vertex_sandbox_proc,
)

_FILE_SECONDS = file_order.recorder()
GC_YOUNG_THRESHOLD = 20_000  # new objects between the collector's young passes (Python's default: 700)


def pytest_configure(config: pytest.Config) -> None:
    """Python's own SIGINT handler, as in a terminal, however the suite was started; a collector sized for the
    worker's heap, and an exit that does not walk it.

    Started as a script's background job (``cmd &``, as runners and ``nohup`` scripts start it), a process has SIGINT
    ignored, and Dagster sets SIGTERM to SIGINT's handler after every in-process run (``dagster._utils.interrupts``):
    the worker then ignored SIGTERM, and so did every server it started afterwards, exec keeping an ignored signal.
    The GCS emulator and the CLI fork server each outlived their SIGTERM at teardown until SIGKILL.
    (``test_quota_procs`` starts the CLI with SIGINT ignored on purpose.)"""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # The collector's young generation is collected every 20,000 new objects, not every 700: a worker's heap (Dagster,
    # Polars, Arrow, every run's events) is millions of objects, and each full pass over it (~0.3 s) came with the
    # young passes' count. Measured on three Dagster-heavy files: the collector 5.7-6.2 -> 3.5 CPU s of ~63.
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    # and at its exit, the interpreter's last full passes skip that heap, as in the project's processes: ~2 CPU s
    # less for each worker after two Dagster-heavy files (benchmarks/README.md)
    no_collection_at_exit()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest files first (``file_order``): the workers then end together."""
    items[:] = file_order.longest_files_first(items, file_order.known_seconds())


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _FILE_SECONDS is not None:
        _FILE_SECONDS.add(report)


def pytest_sessionfinish() -> None:
    if _FILE_SECONDS is not None and _FILE_SECONDS.seconds:
        _FILE_SECONDS.write()


@pytest.fixture(scope="session")
def cli(tmp_path_factory) -> Iterator[CliForks]:
    """`batch-pipeline` processes forked from a server that did the CLI's imports (``cli_forks``): ``cli.run(args,
    env=..., timeout=...)`` as ``subprocess.run``, ``cli.popen(args, ...)`` as ``subprocess.Popen``."""
    with cli_fork_server(tmp_path_factory.mktemp("cli_forks")) as forks:
        yield forks


@pytest.fixture(scope="session")
def sandbox_proc() -> Iterator[tuple[Popen[str], str]]:
    """The provider sandbox as a real subprocess on a free loopback port, one per test process (each test resets it
    through ``sandbox`` or ``admin``; a start costs ~0.5 CPU s, the tokenizer's ranks included): yields ``(proc,
    url)``.

    ``url`` is ``http://127.0.0.1:PORT`` (OpenAI clients use ``url + "/v1"``). Stopped by PID at teardown.
    """
    proc, url = start_sandbox_process(port=0)
    try:
        yield proc, url
    finally:
        stop_sandbox_process(proc)


@pytest.fixture
def admin(sandbox_proc, monkeypatch) -> SandboxAdmin:
    """The worker's sandbox, reset for this test, wired in through $BATCH_PIPELINE_SANDBOX_URL, with no real
    provider key in reach."""
    _, url = sandbox_proc
    sandbox = SandboxAdmin(url)
    sandbox.reset()
    monkeypatch.setenv("BATCH_PIPELINE_SANDBOX_URL", url)
    for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(key, raising=False)
    return sandbox
