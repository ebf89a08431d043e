"""Executor tests talk to the module's sandbox process, reset for each test, with no real keys in reach."""

import time

from batch_pipeline.core.ledger.executor import BatchExecutor, BatchHandle, BatchStatus
from batch_pipeline_tests.gcs_fixtures import gcs_emulator, vertex_sandbox, vertex_sandbox_proc  # noqa: F401


def wait_ended(ex: BatchExecutor, handle: BatchHandle) -> BatchStatus:
    """Poll until the sandbox batch has ended (its clock runs fast)."""
    for _ in range(200):
        status = ex.poll(handle)
        if status.state.ended:
            return status
        time.sleep(0.05)
    raise AssertionError("batch never ended")
