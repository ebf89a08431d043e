"""Dagster entry point: one set of assets, checks and jobs per job spec in data/jobs/ (or $BATCH_PIPELINE_JOBS)."""

import os
from pathlib import Path

import dagster as dg

from batch_pipeline.core.spec import JobSpec, load_specs
from batch_pipeline.defs.assets import build_job_assets
from batch_pipeline.defs.jobs import build_jobs
from batch_pipeline.defs.resources import PROJECT_ROOT, default_resources


def jobs_dir() -> Path:
    return Path(os.environ.get("BATCH_PIPELINE_JOBS", PROJECT_ROOT / "data" / "jobs"))


def build_definitions(specs: list[JobSpec], resources: dict | None = None) -> dg.Definitions:
    assets, checks, jobs = [], [], []
    for spec in specs:
        a, c = build_job_assets(spec)
        assets += a
        checks += c
        jobs += build_jobs(spec)
    return dg.Definitions(assets=assets, asset_checks=checks, jobs=jobs, resources=resources or default_resources())


defs = build_definitions(load_specs(jobs_dir()))
