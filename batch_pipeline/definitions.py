"""Dagster entry point: one set of assets, checks and jobs per job spec in data/jobs/ (or $BATCH_PIPELINE_JOBS)."""

from batch_pipeline.core.spec.loading import load_specs
from batch_pipeline.defs.build import build_definitions, jobs_dir

defs = build_definitions(load_specs(jobs_dir()))
