"""batch_pipeline: offline batch LLM inference on Dagster.

``batch_pipeline.BatchInferenceJob`` is the job spec as a Dagster Component (``type:`` of a ``defs.yaml``); it is
imported on first use, so ``import batch_pipeline.core`` (or the sandbox) does not pull in dagster.
"""

import os

# No step of the pipeline multiplies matrices, but numpy's OpenBLAS starts a thread per core at import and spins it
# for ~0.1 s: 0.11 CPU s more for every process that imports numpy (each CLI run, code server, run worker and step
# pod). Set before numpy is first imported (the package is imported first in each of those; dagster itself does
# not import numpy); an explicit setting is kept.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

__all__ = ["BatchInferenceJob"]


def __getattr__(name: str):
    if name == "BatchInferenceJob":
        from batch_pipeline.defs.component import BatchInferenceJob

        return BatchInferenceJob
    raise AttributeError(f"module 'batch_pipeline' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
