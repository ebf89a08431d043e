"""The exit of a process that loaded the project, without the interpreter's last full collections.

At exit, CPython collects the whole heap again before it frees it (while it clears the modules), though everything
goes with the process anyway. Measured here (``benchmarks/exit_bench.py``), that is 0.6 CPU s of a process that
had only imported the code location and 1.5-1.9 s after a small ``batch-pipeline run``: a quarter of each. Freezing
the heap at exit (``gc.freeze()``, the last thing before the interpreter finalizes) keeps those passes off it.

Nothing is lost: Python never promised to finalize objects still alive at exit, and what the project writes it
closes itself (context managers), never through a finalizer. A leaf module, so the sandbox may import it.
"""

import atexit
import gc

_REGISTERED = [False]


def no_collection_at_exit() -> None:
    """Freeze the heap at this process's exit (an ``atexit`` handler), once per process. Called by the processes
    that load the project: ``batch-pipeline``, the sandbox, and Dagster's code servers and run workers (through the
    code location, ``batch_pipeline.definitions``)."""
    if not _REGISTERED[0]:
        _REGISTERED[0] = True
        atexit.register(gc.freeze)
