"""Staged publishing: `<job>/results` is the staged table, `<job>/validated` is promoted only when every blocking
check on results passed. Each fault is written at a real boundary (a result part in the store) after a clean run;
the check it trips must fail, and neither the validated Parquet file nor the DuckDB views may change."""

from pathlib import Path

import dagster as dg
import duckdb
import polars as pl
import pytest

from batch_pipeline.core.ledger.result_parts import read_results, write_results
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline.defs.assets import asset_key
from batch_pipeline.defs.build import build_definitions
from batch_pipeline.defs.checks import CHECKS
from batch_pipeline.defs.pipeline import run_job

STRAY_ID = "f" * 64

# check name -> how one succeeded result row is rewritten so that exactly this check trips (others may too)
FAULTS = {
    "no_truncated_outputs": lambda row: row.with_columns(pl.lit("length").alias("finish_reason")),
    "outputs_within_contract": lambda row: row.with_columns(
        pl.lit("not_a_label").alias("output_text"), pl.lit("not_a_label").alias("parsed_output")
    ),
    "validated_schema": lambda row: row.with_columns(pl.lit("some-other-model").alias("model")),
    "reconciliation": lambda row: row.with_columns(pl.lit(STRAY_ID).alias("request_id")),
}


def publish(spec, instance, resources, names=("results", "validated")) -> dg.ExecuteInProcessResult:
    """Materialize results + validated (the blocking checks on results come with the selection)."""
    defs = build_definitions([spec], resources)
    return dg.materialize(
        [*defs.assets, *defs.asset_checks],
        selection=[asset_key(spec, n) for n in names],
        instance=instance,
        resources=defs.resources,
        raise_on_error=False,
    )


def materialized(result: dg.ExecuteInProcessResult) -> set[str]:
    return {e.asset_key.path[-1] for e in result.get_asset_materialization_events()}


def check_verdicts(result: dg.ExecuteInProcessResult) -> dict[str, bool]:
    return {e.check_name: e.passed for e in result.get_asset_check_evaluations()}


def duckdb_validated(db: Path) -> pl.DataFrame:
    con = duckdb.connect(str(db), read_only=True)
    try:
        table = con.sql(
            "SELECT request_id, model, finish_reason, output FROM validated ORDER BY source, line"
        ).to_arrow_table()
    finally:
        con.close()
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    return frame


def file_identity(path: Path) -> tuple[bytes, int, int]:
    """Bytes and (inode, mtime): a promotion replaces the file, so even identical bytes get a new inode."""
    stat = path.stat()
    return path.read_bytes(), stat.st_ino, stat.st_mtime_ns


def clean_run(spec, instance, resources, home) -> Store:
    run_job(spec, instance, resources)
    result = publish(spec, instance, resources)  # promoted here even before the pipeline's publish list has it
    assert result.success and "validated" in materialized(result)
    assert check_verdicts(result) == {**{c: True for c in CHECKS}, "shard_distributions": True}
    return Store(home)


def inject(store: Store, spec, check: str) -> str:
    """Write one extra result part whose row makes ``check`` fail; return the request ID it touches."""
    results = read_results(store, spec.name)
    row = results.filter(pl.col("status") == "succeeded").sort("request_id").head(1)
    request_id, shard = row["request_id"][0], row["shard_id"][0]
    attempt = int(results.filter(pl.col("request_id") == request_id)["attempt"].max()) + 1
    bad = FAULTS[check](row).with_columns(pl.lit(attempt, pl.Int32).alias("attempt"))  # the latest valid result
    write_results(store, spec.name, shard, attempt, 1, bad.to_arrow())
    return bad["request_id"][0]


@pytest.mark.parametrize("check", CHECKS)
def test_a_failed_blocking_check_leaves_the_validated_table_untouched(
    sandbox, make_job, instance, resources, home, check
):
    spec = make_job()
    store = clean_run(spec, instance, resources, home)
    paths = JobPaths(spec.name)
    validated, db = store.local_path(paths.validated), store.local_path(paths.duckdb)
    before, db_before = file_identity(validated), file_identity(db)
    view_before = duckdb_validated(db)
    assert view_before.height == pl.read_parquet(validated).height > 0

    touched = inject(store, spec, check)

    result = publish(spec, instance, resources)
    verdicts = check_verdicts(result)
    assert verdicts[check] is False, verdicts
    assert not result.success
    assert "results" in materialized(result) and "validated" not in materialized(result)
    # Dagster skipped the step (the blocking check), it did not start it and fail in the asset's own guard
    started = {e.step_key for e in result.all_events if e.event_type_value == "STEP_START"}
    assert f"{spec.name}__validated" not in started and f"{spec.name}__results" in started
    staged = pl.read_parquet(store.local_path(paths.staged))
    if check != "reconciliation":  # the fault reached the staged table (a stray ID joins no source row)
        assert staged.filter(pl.col("request_id") == touched).height >= 1
        assert staged.to_dicts() != pl.read_parquet(validated).to_dicts()
    # users still read the previous table, byte for byte, and the DuckDB views were not rebuilt
    assert file_identity(validated) == before
    assert file_identity(db) == db_before
    assert duckdb_validated(db).equals(view_before)

    # a later run that selects validated alone is refused too: the latest checks on results did not pass
    alone = publish(spec, instance, resources, names=("validated",))
    assert not alone.success and "validated" not in materialized(alone)
    failure = next(e for e in alone.all_events if e.event_type_value == "STEP_FAILURE")
    assert f"{check} failed" in failure.step_failure_data.user_failure_data.description
    assert file_identity(validated) == before


def test_the_pass_path_promotes_the_staged_table(sandbox, make_job, instance, resources, home):
    spec = make_job()
    store = clean_run(spec, instance, resources, home)
    paths = JobPaths(spec.name)
    validated = store.local_path(paths.validated)
    assert validated.read_bytes() == store.local_path(paths.staged).read_bytes()
    assert store.read_bytes(paths.dead_letters) == store.read_bytes(paths.staged_dead_letters)
    rows = pl.read_parquet(validated).height
    assert duckdb_validated(store.local_path(paths.duckdb)).height == rows > 0
    # publishing again replaces the promoted file with the newly staged one
    old_inode = validated.stat().st_ino
    result = publish(spec, instance, resources)
    assert result.success and "validated" in materialized(result)
    assert validated.stat().st_ino != old_inode
    assert validated.read_bytes() == store.local_path(paths.staged).read_bytes()
    [mat] = [e for e in result.get_asset_materialization_events() if e.asset_key == asset_key(spec, "validated")]
    meta = mat.step_materialization_data.materialization.metadata
    assert meta["dagster/row_count"].value == rows and meta["validated"].value == str(validated)


def test_validated_refuses_results_whose_checks_never_ran(sandbox, make_job, instance, resources, home):
    spec = make_job()
    store = clean_run(spec, instance, resources, home)
    validated = store.local_path(JobPaths(spec.name).validated)
    before = file_identity(validated)
    defs = build_definitions([spec], resources)
    # results re-staged in a run without its checks: the latest materialization is unchecked
    staged = dg.materialize(
        [*defs.assets], selection=[asset_key(spec, "results")], instance=instance, resources=defs.resources
    )
    assert staged.success and not staged.get_asset_check_evaluations()
    alone = publish(spec, instance, resources, names=("validated",))
    assert not alone.success
    failure = next(e for e in alone.all_events if e.event_type_value == "STEP_FAILURE")
    assert "has not run on the latest materialization" in failure.step_failure_data.user_failure_data.description
    assert file_identity(validated) == before
