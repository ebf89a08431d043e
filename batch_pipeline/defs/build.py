"""Build the Dagster definitions of job specs (used by ``definitions.py``, the Component, the CLI and the tests).

``build_job_defs`` is one job's assets, checks, jobs, sensors and schedules (what ``BatchInferenceJob.build_defs``
returns); ``build_definitions`` puts several together with the code location's resources and executor. Kept apart
from ``definitions.py``, which loads every spec of the project at import: ``batch-pipeline run`` builds only its
own job, so a broken unrelated spec cannot break a run.
"""

import dagster as dg

from batch_pipeline.core.settings import Settings
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.defs.assets import build_job_assets
from batch_pipeline.defs.evals import build_eval_defs
from batch_pipeline.defs.jobs import build_jobs
from batch_pipeline.defs.k8s import location_executor
from batch_pipeline.defs.manifest_parts import with_file_steps
from batch_pipeline.defs.resources import resources_of
from batch_pipeline.defs.sensors import build_new_data_sensor, build_shard_sensor, build_upstream_sensor


def build_job_defs(spec: JobSpec, settings: Settings | None = None) -> dg.Definitions:
    """One job spec's assets, checks, jobs, sensors and schedules (no resources, no executor). ``settings``: the
    edge's (unset: the defaults, not the environment)."""
    settings = settings or Settings()
    eval_assets, eval_jobs, eval_schedules = build_eval_defs(spec)
    assets, checks = build_job_assets(spec, settings)
    assets = with_file_steps(spec, settings, assets)  # on the k8s executor: one manifest step per input file
    job_defs = build_jobs(spec)
    # a job's input is files (a new-data sensor) or another job's table (a sensor on its publishes)
    start = build_upstream_sensor if spec.input.from_job else build_new_data_sensor
    return dg.Definitions(
        assets=[*eval_assets, *assets],
        asset_checks=checks,
        jobs=[*eval_jobs, *job_defs.values()],
        sensors=[start(spec, job_defs, settings), build_shard_sensor(spec, job_defs, settings)],
        schedules=eval_schedules,
    )


def location_defs(settings: Settings, resources: dict | None = None) -> dg.Definitions:
    """What the code location adds to its jobs: the store and prices resources, and the executor."""
    return dg.Definitions(resources=resources or resources_of(settings), executor=location_executor(settings.k8s))


def build_definitions(
    specs: list[JobSpec], resources: dict | None = None, settings: Settings | None = None
) -> dg.Definitions:
    """Several jobs with the code location's resources (``resources``, else the settings') and executor."""
    settings = settings or Settings()
    return dg.Definitions.merge(*[build_job_defs(spec, settings) for spec in specs], location_defs(settings, resources))
