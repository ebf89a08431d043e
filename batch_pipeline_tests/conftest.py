"""Shared pytest fixtures."""

from __future__ import annotations

from collections.abc import Iterator
from subprocess import Popen

import pytest

from batch_pipeline.sandbox import SandboxAdmin, start_sandbox_process, stop_sandbox_process


@pytest.fixture(scope="module")
def sandbox_proc() -> Iterator[tuple[Popen[str], str]]:
    """The provider sandbox as a real subprocess on a free loopback port: yields ``(proc, url)``.

    ``url`` is ``http://127.0.0.1:PORT`` (OpenAI clients use ``url + "/v1"``). Stopped by PID at teardown.
    """
    proc, url = start_sandbox_process(port=0)
    try:
        yield proc, url
    finally:
        stop_sandbox_process(proc)


@pytest.fixture
def admin(sandbox_proc, monkeypatch) -> SandboxAdmin:
    """The module's sandbox, reset for this test, wired in through $BATCH_PIPELINE_SANDBOX_URL, with no real
    provider key in reach."""
    _, url = sandbox_proc
    sandbox = SandboxAdmin(url)
    sandbox.reset()
    monkeypatch.setenv("BATCH_PIPELINE_SANDBOX_URL", url)
    for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(key, raising=False)
    return sandbox
