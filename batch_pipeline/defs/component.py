"""``batch_pipeline.BatchInferenceJob``: one job spec as a Dagster Component.

A ``<defs folder>/<job>/defs.yaml`` says ``type: batch_pipeline.BatchInferenceJob``, and its ``attributes`` are the
job spec (the keys of a ``data/jobs/*.yaml`` spec, validated by the same pydantic model: unknown keys refused).
Relative paths in it (``input.path``, ``quality.golden``) are read from the project root, as those of a
``data/jobs/`` spec are. ``build_defs`` returns the job's assets, checks, jobs, sensors and schedules
(``build.build_job_defs``); the resources and the executor are the code location's (``definitions.py``).
Reading a ``defs.yaml`` without dagster (the CLI) is ``job_files.load_defs_yaml``.
"""

import dagster as dg
from pydantic import Field
from pydantic.json_schema import SkipJsonSchema

from batch_pipeline.core.arrow_pool import use_arrow_pool
from batch_pipeline.core.errors import ConfigError
from batch_pipeline.core.settings import Settings
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.spec.job_files import DEFS_FILE, placed
from batch_pipeline.defs.build import build_job_defs
from batch_pipeline.defs.scaffold import BatchInferenceJobScaffolder


@dg.scaffold_with(BatchInferenceJobScaffolder)
class BatchInferenceJob(JobSpec, dg.Component):
    """A batch inference job: manifest, quote, shard submissions and results, the checked and validated table, dead
    letters and the report, with the jobs and sensors that drive them. The attributes are the job spec."""

    # set by the loader (the defs.yaml it came from), never written in one
    source_path: SkipJsonSchema[str | None] = Field(default=None, exclude=True)

    @classmethod
    def get_model_cls(cls) -> type[JobSpec]:
        return cls  # the attributes are validated as the job spec itself, model validators included

    @classmethod
    def load(cls, attributes: "BatchInferenceJob | None", context: dg.ComponentLoadContext) -> "BatchInferenceJob":
        if attributes is None:
            raise ConfigError(f"{context.path / DEFS_FILE}: a BatchInferenceJob needs attributes (its job spec)")
        return placed(attributes, context.path / DEFS_FILE, context.project_root)

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        """The job's definitions, with the settings of this load's environment (the Component's edge)."""
        settings = Settings.from_env()
        use_arrow_pool(settings.arrow_memory_pool)
        return build_job_defs(self, settings)
