"""Settings the suite's conftest makes in every worker."""

import gc

from batch_pipeline_tests.conftest import WORKER_GC_THRESHOLD


def test_a_worker_collects_young_garbage_every_20000_allocations():
    assert gc.get_threshold() == WORKER_GC_THRESHOLD
    assert WORKER_GC_THRESHOLD[0] == 20_000
