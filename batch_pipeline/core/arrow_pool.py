"""The process's Arrow memory pool, chosen once at the edge of a process (``Settings.arrow_memory_pool``).

pyarrow's own default on Linux is mimalloc, which hands freed pages back to the kernel within milliseconds; the
next large buffer then faults in and zeroes fresh pages. jemalloc keeps them for a second, and measured here it
took 4-7% less CPU on the manifest and on results ingestion, with a lower peak (``benchmarks/README.md``).
"""

import logging

import pyarrow as pa

log = logging.getLogger(__name__)


def use_arrow_pool(name: str) -> str:
    """Make ``name`` the pool of this process's pyarrow calls; the name of the pool in use afterwards.

    A pyarrow build without that allocator (jemalloc is Linux-only in the wheels) keeps the pool it has.
    """
    current = pa.default_memory_pool()
    if current.backend_name == name:
        return name
    try:
        pool = getattr(pa, f"{name}_memory_pool")()
    except (AttributeError, NotImplementedError, pa.ArrowNotImplementedError) as exc:
        log.info("Arrow memory pool %r is not in this pyarrow build (%s); keeping %s", name, exc, current.backend_name)
        return current.backend_name
    pa.set_memory_pool(pool)
    return pool.backend_name
