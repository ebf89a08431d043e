"""Build the Dagster definitions of a list of job specs (used by ``definitions.py``, the CLI and the tests).

Kept apart from ``definitions.py``, which loads every spec in the jobs folder at import: ``batch-pipeline run``
builds only its own job, so a broken unrelated spec cannot break a run.
"""

from pathlib import Path

import dagster as dg

from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.spec.settings import Settings
from batch_pipeline.defs.assets import build_job_assets
from batch_pipeline.defs.evals import build_eval_defs
from batch_pipeline.defs.jobs import build_jobs
from batch_pipeline.defs.k8s import executor_from_env
from batch_pipeline.defs.resources import default_resources
from batch_pipeline.defs.sensors import build_new_data_sensor, build_shard_sensor, build_upstream_sensor


def jobs_dir() -> Path:
    return Settings.from_env().jobs


def build_definitions(specs: list[JobSpec], resources: dict | None = None) -> dg.Definitions:
    assets, checks, jobs, sensors, schedules = [], [], [], [], []
    for spec in specs:
        eval_assets, eval_jobs, eval_schedules = build_eval_defs(spec)
        assets += eval_assets
        jobs += eval_jobs
        schedules += eval_schedules
        a, c = build_job_assets(spec)
        assets += a
        checks += c
        job_defs = build_jobs(spec)
        jobs += list(job_defs.values())
        # a job's input is files (a new-data sensor) or another job's table (a sensor on its publishes)
        start = build_upstream_sensor if spec.input.from_job else build_new_data_sensor
        sensors += [start(spec, job_defs), build_shard_sensor(spec, job_defs)]
    return dg.Definitions(
        assets=assets,
        asset_checks=checks,
        jobs=jobs,
        sensors=sensors,
        schedules=schedules,
        resources=resources or default_resources(),
        executor=executor_from_env(),
    )
