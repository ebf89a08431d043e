"""Blocking checks on the staged table (`<job>/results`): schema (pandera), contract, truncation, reconciliation.

Blocking: when one fails, `<job>/validated` is not materialized and the previous validated table stays.
"""

import dagster as dg
import pandera.pandas as pa
import polars as pl

from batch_pipeline.core.errors import ReconciliationError
from batch_pipeline.core.ledger.result_parts import read_results
from batch_pipeline.core.publish.tables import JobState
from batch_pipeline.core.quality.shard_stats import shard_outliers
from batch_pipeline.core.quality.validate import validate
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


def validated_frame_schema(spec: JobSpec) -> pa.DataFrameSchema:
    output_checks = [pa.Check.isin(spec.output.choice)] if spec.output.choice else []
    return pa.DataFrameSchema(
        {
            "source": pa.Column(str),
            "line": pa.Column(int, pa.Check.ge(1)),
            "source_key": pa.Column(str, nullable=True),
            "request_id": pa.Column(str, pa.Check.str_matches(r"^[0-9a-f]{64}$")),
            "shard_id": pa.Column(str),
            "output": pa.Column(str, output_checks, nullable=False),
            "finish_reason": pa.Column(str, pa.Check.ne("length"), nullable=True),
            "model": pa.Column(str, pa.Check.isin(spec.answering_models())),
            "prompt_version": pa.Column(str, pa.Check.eq(spec.prompt.version)),
            "attempt": pa.Column("int32", pa.Check.ge(1)),
            "input_tokens": pa.Column(int, pa.Check.ge(0)),
            "output_tokens": pa.Column(int, pa.Check.ge(0)),
            "cost_usd": pa.Column(float, pa.Check.ge(0)),
            "is_duplicate": pa.Column(bool),
        },
        unique=["source", "line"],
        strict=False,
        coerce=False,
    )


def build_result_checks(spec: JobSpec, results_asset: dg.AssetsDefinition) -> dg.AssetChecksDefinition:
    paths = JobPaths(spec.name)
    specs = [
        dg.AssetCheckSpec(name, asset=results_asset, blocking=True, description=check_description(name, spec.name))
        for name in CHECKS
    ]

    @dg.multi_asset_check(specs=specs, name=f"{spec.name}_result_checks")
    def result_checks(store: StoreResource):
        st = store.get()
        table = pl.read_parquet(st.read_bytes(paths.staged))
        frame = table.to_pandas()
        key = results_asset.key
        # 1. schema
        try:
            validated_frame_schema(spec).validate(frame, lazy=True)
            yield dg.AssetCheckResult(
                check_name="validated_schema",
                asset_key=key,
                passed=True,
                metadata={"rows": dg.MetadataValue.int(len(frame))},
            )
        except pa.errors.SchemaErrors as exc:
            cases = pl.from_pandas(exc.failure_cases.astype(str))
            yield dg.AssetCheckResult(
                check_name="validated_schema",
                asset_key=key,
                passed=False,
                metadata={"failures": dg.MetadataValue.int(cases.height), "failure_cases": md_table(cases, limit=20)},
            )
        # 2. every output to be published honours the contract (re-validated from the raw text)
        raw = table.select(
            pl.col("request_id"),
            pl.lit(200, pl.Int32).alias("http_status"),
            "output_text",
            "finish_reason",
            *[pl.lit(None, pl.Int64).alias(c) for c in ("input_tokens", "cached_tokens", "output_tokens")],
            *[
                pl.lit(None, pl.String).alias(c)
                for c in ("error_code", "error_message", "provider_request_id", "raw_payload")
            ],
        ).to_arrow()
        verdicts = validate(raw, spec.output, table["embedding"].to_arrow() if "embedding" in table.columns else None)
        bad = [i for i, s in enumerate(verdicts.status.to_pylist()) if s != "succeeded"]
        yield dg.AssetCheckResult(
            check_name="outputs_within_contract",
            asset_key=key,
            passed=not bad,
            metadata={"violations": dg.MetadataValue.int(len(bad)), "contract": spec.output.kind},
        )
        # 3. no truncated output is about to be published
        truncated = table.filter(pl.col("finish_reason") == "length").height
        yield dg.AssetCheckResult(
            check_name="no_truncated_outputs",
            asset_key=key,
            passed=truncated == 0,
            metadata={"truncated": dg.MetadataValue.int(truncated)},
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
        results = read_results(
            store.get(),
            spec.name,
            columns=["request_id", "attempt", "shard_id", "status", "parsed_output", "output_tokens", "error_message"],
        )
        stats = shard_outliers(results, spec.output.kind)
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
