"""Executor tests talk to the worker's sandbox process, reset for each test, with no real keys in reach."""

import time

from batch_pipeline.core.ledger.executor import BatchExecutor, BatchHandle, BatchStatus


def wait_ended(ex: BatchExecutor, handle: BatchHandle, timeout: float = 60.0) -> BatchStatus:
    """Poll until the sandbox batch has ended (its clock runs fast), to a generous deadline: a loaded machine is
    slow, not wrong."""
    deadline = time.monotonic() + timeout
    while True:
        status = ex.poll(handle)
        if status.state.ended:
            return status
        assert time.monotonic() < deadline, f"batch {handle.batch_id} never ended: {status.state}"
        time.sleep(0.05)
