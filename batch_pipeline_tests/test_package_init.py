"""What importing the package does to the process: OpenBLAS gets one thread, so numpy's import spins none."""

import os
import subprocess
import sys

import pytest

THREADS = "import os; print(len(os.listdir('/proc/self/task')))"


def threads_after(imports: str, **env: str) -> int:
    """The thread count of a fresh interpreter after ``imports`` (OPENBLAS_NUM_THREADS as given, else unset)."""
    environ = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"} | env
    out = subprocess.run(
        [sys.executable, "-c", f"{imports}; {THREADS}"], env=environ, capture_output=True, text=True, check=True
    )
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not os.path.isdir("/proc/self/task") or (os.cpu_count() or 1) < 2, reason="Linux, 2+ cores")
def test_numpy_imported_after_the_package_starts_no_blas_threads():
    assert threads_after("import numpy") > 1  # what the package prevents: one OpenBLAS thread per core
    assert threads_after("import batch_pipeline, numpy") == 1
    assert threads_after("import batch_pipeline, numpy", OPENBLAS_NUM_THREADS="2") == 2  # an explicit setting stays


def test_dagster_does_not_import_numpy_before_the_code_location():
    # a code server or run worker imports dagster, then the code location (the package first): were numpy in
    # before, the setting would come too late
    out = subprocess.run(
        [sys.executable, "-c", "import sys, dagster; print('numpy' in sys.modules)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "False"
