"""Validation, canary and golden probes, per-shard statistics, the judge, evals."""
