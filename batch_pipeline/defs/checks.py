"""Blocking checks on the staged table (`<job>/results`): schema (pandera), contract, truncation, reconciliation.

Blocking: when one fails, `<job>/validated` is not materialized and the previous validated table stays.
"""

import dagster as dg
import polars as pl

from batch_pipeline.core.errors import ReconciliationError
from batch_pipeline.core.publish.gate import check_staged
from batch_pipeline.core.publish.scan import job_shard_outliers
from batch_pipeline.core.publish.tables import JobState
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.troubleshooting import lookup
from batch_pipeline.defs.metadata import md_table, plain
from batch_pipeline.defs.resources import StoreResource

CHECKS = ("validated_schema", "outputs_within_contract", "no_truncated_outputs", "reconciliation")


def check_description(name: str, job: str = "<job>") -> str:
    """What a failure of the check means and what fixes it: its row of the troubleshooting table (README)."""
    row = lookup(name)
    assert row is not None, f"check {name} has no row in core/troubleshooting.py"
    return f"Fails when {row.meaning}. Fix: {row.fix.replace('<job>', job)}."


def build_result_checks(spec: JobSpec, results_asset: dg.AssetsDefinition) -> dg.AssetChecksDefinition:
    paths = JobPaths(spec.name)
    specs = [
        dg.AssetCheckSpec(name, asset=results_asset, blocking=True, description=check_description(name, spec.name))
        for name in CHECKS
    ]

    @dg.multi_asset_check(specs=specs, name=f"{spec.name}_result_checks")
    def result_checks(store: StoreResource):
        st = store.get()
        key = results_asset.key
        gate = check_staged(spec, st, paths.staged)  # a chunk of rows at a time (core/publish/gate.py)
        # 1. schema: the pandera rules per chunk, one row per source line over the whole file
        schema_meta = (
            {"rows": dg.MetadataValue.int(gate.rows)}
            if gate.schema_ok
            else {
                "failures": dg.MetadataValue.int(gate.schema_failures + gate.duplicate_lines),
                "failure_cases": md_table(gate.failure_cases(), limit=20),
            }
        )
        yield dg.AssetCheckResult(
            check_name="validated_schema", asset_key=key, passed=gate.schema_ok, metadata=schema_meta
        )
        # 2. every output to be published honours the contract (re-validated from the raw text)
        yield dg.AssetCheckResult(
            check_name="outputs_within_contract",
            asset_key=key,
            passed=gate.contract_violations == 0,
            metadata={"violations": dg.MetadataValue.int(gate.contract_violations), "contract": spec.output.kind},
        )
        # 3. no truncated output is about to be published
        yield dg.AssetCheckResult(
            check_name="no_truncated_outputs",
            asset_key=key,
            passed=gate.truncated == 0,
            metadata={"truncated": dg.MetadataValue.int(gate.truncated)},
        )
        # 4. expected = valid + invalid + missing + dead_lettered, per shard and per job
        state = JobState.load(spec, st)
        try:
            counts = state.check()
            yield dg.AssetCheckResult(
                check_name="reconciliation", asset_key=key, passed=True, metadata=plain(counts.as_dict())
            )
        except ReconciliationError as exc:
            yield dg.AssetCheckResult(
                check_name="reconciliation",
                asset_key=key,
                passed=False,
                metadata={"error": dg.MetadataValue.text(str(exc)[:2000])},
            )

    return result_checks


def build_shard_stats_check(spec: JobSpec, results_asset: dg.AssetsDefinition) -> dg.AssetChecksDefinition:
    """Non-blocking: flags shards whose labels, output lengths or refusals stand out from their neighbours."""

    @dg.asset_check(
        asset=results_asset,
        name="shard_distributions",
        blocking=False,
        description="Per-shard label distribution, output length and refusal rate vs the other shards. "
        + check_description("shard_distributions", spec.name),
    )
    def shard_distributions(store: StoreResource) -> dg.AssetCheckResult:
        stats = job_shard_outliers(spec, store.get())  # a group of shards at a time
        flagged = stats.filter(pl.col("flagged").is_not_null())
        return dg.AssetCheckResult(
            passed=flagged.height == 0,
            severity=dg.AssetCheckSeverity.WARN,
            metadata={
                "flagged_shards": dg.MetadataValue.text(", ".join(flagged["shard_id"]) or "none"),
                "per_shard": md_table(stats, limit=50),
            },
        )

    return shard_distributions
