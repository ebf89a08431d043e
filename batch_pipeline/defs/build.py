"""Build the Dagster definitions of job specs (used by ``definitions.py``, the Component, the CLI and the tests).

``build_job_defs`` is one job's assets, checks, jobs, sensors and schedules (what ``BatchInferenceJob.build_defs``
returns); ``build_definitions`` puts several together with the code location's resources and executor. Kept apart
from ``definitions.py``, which loads every spec of the project at import: ``batch-pipeline run`` builds only its
own job, so a broken unrelated spec cannot break a run.
"""

from pathlib import Path

import dagster as dg

from batch_pipeline.core.settings import Settings
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.defs.assets import build_job_assets
from batch_pipeline.defs.evals import build_eval_defs
from batch_pipeline.defs.jobs import build_jobs
from batch_pipeline.defs.k8s import executor_from_env
from batch_pipeline.defs.resources import default_resources
from batch_pipeline.defs.sensors import build_new_data_sensor, build_shard_sensor, build_upstream_sensor


def jobs_dir() -> Path:
    return Settings.from_env().jobs


def build_job_defs(spec: JobSpec) -> dg.Definitions:
    """One job spec's assets, checks, jobs, sensors and schedules (no resources, no executor)."""
    eval_assets, eval_jobs, eval_schedules = build_eval_defs(spec)
    assets, checks = build_job_assets(spec)
    job_defs = build_jobs(spec)
    # a job's input is files (a new-data sensor) or another job's table (a sensor on its publishes)
    start = build_upstream_sensor if spec.input.from_job else build_new_data_sensor
    return dg.Definitions(
        assets=[*eval_assets, *assets],
        asset_checks=checks,
        jobs=[*eval_jobs, *job_defs.values()],
        sensors=[start(spec, job_defs), build_shard_sensor(spec, job_defs)],
        schedules=eval_schedules,
    )


def location_defs(resources: dict | None = None) -> dg.Definitions:
    """What the code location adds to its jobs: the store and prices resources, and the executor."""
    return dg.Definitions(resources=resources or default_resources(), executor=executor_from_env())


def build_definitions(specs: list[JobSpec], resources: dict | None = None) -> dg.Definitions:
    return dg.Definitions.merge(*[build_job_defs(spec) for spec in specs], location_defs(resources))
