"""Executor tests talk to the module's sandbox process, reset for each test, with no real keys in reach."""

import time

import pytest

from batch_pipeline.core.run.executor import BatchExecutor, BatchHandle, BatchStatus
from batch_pipeline.sandbox import SandboxAdmin


@pytest.fixture
def admin(sandbox_proc, monkeypatch) -> SandboxAdmin:
    _, url = sandbox_proc
    sandbox = SandboxAdmin(url)
    sandbox.reset()
    monkeypatch.setenv("BATCH_PIPELINE_SANDBOX_URL", url)
    for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(key, raising=False)
    return sandbox


def wait_ended(ex: BatchExecutor, handle: BatchHandle) -> BatchStatus:
    """Poll until the sandbox batch has ended (its clock runs fast)."""
    for _ in range(200):
        status = ex.poll(handle)
        if status.state.ended:
            return status
        time.sleep(0.05)
    raise AssertionError("batch never ended")
