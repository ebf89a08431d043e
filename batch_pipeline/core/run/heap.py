"""The heap a long run starts with, kept out of the garbage collector's full passes.

By the time a run starts, the process holds Dagster's modules, the job's definitions and the resources: hundreds of
thousands of objects that live to the end. Every full collection walked all of them again; measured with ``perf``
on ``batch-pipeline run`` at 200k rows, the collector was 8.5% of the run's CPU (``benchmarks/README.md``).
``gc.freeze()`` moves what exists to a permanent generation the collector skips; what the run allocates afterwards
is collected as before, and the heap is thawed when the run ends, so a process that goes on (a test calling the
CLI in-process) is left as it was.

``batch-pipeline run`` uses it, not ``run_job``: after a thaw the collector's next full pass walks the whole heap
again, once. A CLI run pays that once before it exits; a process calling ``run_job`` many times (the test suite's
workers) would pay it at every call.
"""

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def frozen_heap() -> Iterator[bool]:
    """Freeze the objects alive now for the block; yields whether this call froze them.

    When something else in the process has frozen its heap already, it is left alone (its ``unfreeze`` is its own
    to make), and so is a collector that is switched off.
    """
    if gc.get_freeze_count() or not gc.isenabled():
        yield False
        return
    # no collection first: one over this heap costs 0.1-0.5 s, and whatever garbage is frozen with it is
    # collected after the thaw
    gc.freeze()
    try:
        yield True
    finally:
        gc.unfreeze()
