"""Shared pytest fixtures."""

from __future__ import annotations

from collections.abc import Iterator
from subprocess import Popen

import pytest

from batch_pipeline.sandbox import start_sandbox_process, stop_sandbox_process


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
