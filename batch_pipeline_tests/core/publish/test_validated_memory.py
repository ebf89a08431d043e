"""The validated table's query is the run's peak (``write_validated``): what earlier steps freed is handed back to
the OS before it, or it stacks on top of that."""

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.compute as pc

from batch_pipeline.core.publish.validated import return_freed_memory


def _rss_mib() -> float:
    return psutil.Process().memory_info().rss / 2**20


def test_freed_arrow_memory_goes_back_to_the_os_before_the_query():
    base = pa.array(np.arange(100_000))
    arrays = [pc.add(base, i) for i in range(300)]  # ~240 MiB allocated from Arrow's pool
    held = _rss_mib()
    del arrays
    assert _rss_mib() > held - 60  # freed, but still the process's: Arrow's pool keeps what it had
    return_freed_memory()
    assert _rss_mib() < held - 150
