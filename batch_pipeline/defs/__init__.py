"""Dagster-only code: assets, checks, jobs, resources. Thin wrappers over core/."""

import warnings

import dagster as dg

# BackfillPolicy (one run for a range of shard partitions) is marked beta; we depend on it on purpose.
warnings.filterwarnings("ignore", category=dg.BetaWarning)
