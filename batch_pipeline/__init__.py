"""batch_pipeline: offline batch LLM inference on Dagster.

``batch_pipeline.BatchInferenceJob`` is the job spec as a Dagster Component (``type:`` of a ``defs.yaml``); it is
imported on first use, so ``import batch_pipeline.core`` (or the sandbox) does not pull in dagster.
"""

__all__ = ["BatchInferenceJob"]


def __getattr__(name: str):
    if name == "BatchInferenceJob":
        from batch_pipeline.defs.component import BatchInferenceJob

        return BatchInferenceJob
    raise AttributeError(f"module 'batch_pipeline' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
