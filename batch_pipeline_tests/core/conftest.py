"""Fixtures of the core tests: sample ticket data generated once per session, demo spec copies."""

import shutil
from pathlib import Path

import pyarrow as pa
import pytest

from batch_pipeline_tests.core.helpers import DEMO_SPEC, load_make_samples

SAMPLE_ROWS = 300
SAMPLE_SEED = 7


@pytest.fixture(scope="session")
def sample_data(tmp_path_factory) -> tuple[Path, dict]:
    """``(project_root, summary)``: ``project_root/data/samples/...`` from scripts/make_samples.py and the
    demo job spec at ``project_root/data/jobs/demo.yaml`` (so its relative input path resolves there)."""
    root = tmp_path_factory.mktemp("project")
    summary = load_make_samples().generate(root / "data", n_rows=SAMPLE_ROWS, seed=SAMPLE_SEED)
    (root / "data" / "jobs").mkdir(parents=True)
    shutil.copy(DEMO_SPEC, root / "data" / "jobs" / "demo.yaml")
    return root, summary


@pytest.fixture
def arrow_pool_restored():
    """The test may change the process's Arrow pool (``core/arrow_pool.py``); the worker gets its own back after."""
    before = pa.default_memory_pool()
    yield
    pa.set_memory_pool(before)
