"""The exit of a process that loaded the project, without the interpreter's last full collections.

At exit, CPython collects the whole heap again (while it clears the modules) before the process frees it all anyway.
Measured with ``benchmarks/exit_bench.py``: 0.5 CPU s of a process that had only imported the code location, and
1.6-1.9 s at the end of ``batch-pipeline run`` of the demo job, about a quarter of each. A ``gc.freeze()`` in an
``atexit`` handler keeps those passes off the heap.

Nothing is lost: Python never promised to finalize objects still alive at exit, and what the project writes it
closes itself (context managers), never through a finalizer. A leaf module, so the sandbox may import it.
"""

import atexit
import gc
from functools import cache


@cache  # once per process
def no_collection_at_exit() -> None:
    """Freeze the heap at this process's exit. Called by the processes that load the project: ``batch-pipeline``,
    the sandbox, and Dagster's code servers and run workers (through the code location, ``definitions.py``)."""
    atexit.register(gc.freeze)
