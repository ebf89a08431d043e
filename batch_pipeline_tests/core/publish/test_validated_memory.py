"""The validated table's query is the run's peak (``write_validated``): what earlier steps freed is handed back to
the OS before it, or it stacks on top of that."""

import time

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from batch_pipeline.core.arrow_pool import use_arrow_pool
from batch_pipeline.core.publish.validated import return_freed_memory


def _rss_mib() -> float:
    return psutil.Process().memory_info().rss / 2**20


@pytest.fixture
def arrow_pool(request, arrow_pool_restored):
    """The pool named by the test's parameter, for the test only (an earlier test's edge may have set another)."""
    assert use_arrow_pool(request.param) == request.param
    return request.param


@pytest.mark.parametrize("arrow_pool", ["mimalloc", "jemalloc", "system"], indirect=True)
def test_freed_arrow_memory_goes_back_to_the_os_before_the_query(arrow_pool):
    base = pa.array(np.arange(100_000))
    arrays = [pc.add(base, i) for i in range(300)]  # ~240 MiB allocated from Arrow's pool
    held = _rss_mib()
    del arrays
    if arrow_pool == "mimalloc":
        assert _rss_mib() > held - 60  # freed, but still the process's: mimalloc keeps what it had
    return_freed_memory()
    if arrow_pool == "jemalloc":
        # pyarrow's jemalloc runs background threads that hand freed pages back after its 1 s decay;
        # ``release_unused`` cannot hurry them, so the pages are waited for (what the decay promises)
        deadline = time.monotonic() + 10
        while _rss_mib() >= held - 150 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert _rss_mib() < held - 150
