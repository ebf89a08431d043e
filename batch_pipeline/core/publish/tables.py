"""The published outputs: the validated table (one row per source row), dead letters, DuckDB views.

Publishing is two steps so that a gate can sit between them: ``stage`` writes the table and the dead
letters under ``staged/`` (where the blocking checks read them), ``promote`` copies the staged files to
``validated/`` (where users read them) and refreshes the DuckDB views. A failed check means no promotion:
the previous validated table stays as it was.

Duplicates are paid once and answered for every row: each source row joins its request's latest
valid result; the cost sits on the first row of a request only, so summing the table's cost gives
what was paid for accepted items.
"""

import logging
from dataclasses import dataclass

import duckdb
import polars as pl

from batch_pipeline.core.quality.golden import GoldenProbes
from batch_pipeline.core.manifest.shards import Manifest
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.state.reconcile import DEAD, check_invariant, item_states
from batch_pipeline.core.run.results import read_results
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.state.replay import Replays
from batch_pipeline.core.store import Store

log = logging.getLogger(__name__)

VALIDATED_COLUMNS = [
    "source", "line", "source_key", "request_id", "shard_id", "output", "output_text", "finish_reason",
    "model", "prompt_version", "backend", "pricing", "attempt", "input_tokens", "cached_tokens", "output_tokens",
    "cost_usd", "is_duplicate", "provider_batch_id",
]


@dataclass
class JobState:
    """Everything derived from the store in one read: items, results, per-item states."""

    items: pl.DataFrame
    results: pl.DataFrame
    states: pl.DataFrame

    probe_results: pl.DataFrame | None = None

    @classmethod
    def load(cls, spec: JobSpec, store: Store) -> "JobState":
        """Items and their results; golden probe results are kept apart (they are not items of the job)."""
        items = pl.from_arrow(Manifest(spec.name, store).item_index())
        assert isinstance(items, pl.DataFrame)
        results = read_results(store, spec.name)
        probes = None
        if spec.quality is not None:
            ids = GoldenProbes(spec, store).all_probe_ids().select("request_id")
            if ids.height:
                probes = results.join(ids, on="request_id", how="semi")
                results = results.join(ids, on="request_id", how="anti")
        return cls(items, results, item_states(items, results, spec.retries, Replays(store, spec.name).table()), probes)

    def check(self):
        return check_invariant(self.items, self.results, self.states)


def validated_table(spec: JobSpec, store: Store, state: JobState) -> pl.DataFrame:
    rows = pl.from_arrow(Manifest(spec.name, store).rows())
    assert isinstance(rows, pl.DataFrame)
    valid = (state.results.filter(pl.col("status") == "succeeded")
             .sort("attempt").unique("request_id", keep="last"))
    table = rows.join(valid.rename({"parsed_output": "output"}), on="request_id", how="inner")
    table = table.sort("source", "line").with_columns(
        pl.col("request_id").is_first_distinct().not_().alias("is_duplicate"))
    table = table.with_columns(pl.when(pl.col("is_duplicate")).then(0.0).otherwise(pl.col("cost_usd")).alias("cost_usd"))
    return table.select(VALIDATED_COLUMNS)


def dead_letters(state: JobState) -> pl.DataFrame:
    return state.states.filter(pl.col("state") == DEAD).select(
        "request_id", "shard_id", "failures", "attempts", "last_status", "last_error_code", "last_error")


def stage(spec: JobSpec, store: Store, state: JobState) -> dict[str, str]:
    """Write the staged table and dead letters (each replaced atomically); nothing users read changes."""
    paths = JobPaths(spec.name)
    store.write_table(paths.staged, validated_table(spec, store, state).to_arrow())
    store.write_table(paths.staged_dead_letters, dead_letters(state).to_arrow())
    return {"staged": store.uri(paths.staged), "staged_dead_letters": store.uri(paths.staged_dead_letters)}


def promote(spec: JobSpec, store: Store) -> dict[str, str]:
    """Copy the staged files to validated/ byte for byte (each write atomic) and refresh the DuckDB views."""
    paths = JobPaths(spec.name)
    missing = [rel for rel in (paths.staged, paths.staged_dead_letters) if not store.exists(rel)]
    if missing:
        raise FileNotFoundError(f"nothing staged to promote for job {spec.name}: {', '.join(missing)} missing")
    store.write_bytes(paths.dead_letters, store.read_bytes(paths.staged_dead_letters))
    store.write_bytes(paths.validated, store.read_bytes(paths.staged))
    out = {"validated": store.uri(paths.validated), "dead_letters": store.uri(paths.dead_letters)}
    db = store.local_path(paths.duckdb)
    if db is not None:
        write_duckdb_views(store, spec.name)
        out["duckdb"] = str(db)
    return out


def write_duckdb_views(store: Store, job: str) -> None:
    """A DuckDB file of views over the job's Parquet files, for ad-hoc SQL (local stores)."""
    paths = JobPaths(job)
    db = store.local_path(paths.duckdb)
    assert db is not None
    root = store.local_path(paths.root)
    gen = Manifest(job, store).last_generation()
    views = {
        "validated": store.local_path(paths.validated),
        "dead_letters": store.local_path(paths.dead_letters),
        "results": f"{root}/results/*/*.parquet",
        "items": f"{root}/manifest/items/*.parquet",
        "source_rows": store.local_path(paths.rows(gen)),
        "rejects": store.local_path(paths.rejects(gen)),
    }
    tmp = db.with_suffix(".duckdb.tmp")
    tmp.unlink(missing_ok=True)
    con = duckdb.connect(str(tmp))
    try:
        for name, target in views.items():
            if "*" not in str(target) and not (target and target.exists()):
                continue
            if "*" in str(target) and not list(root.glob(str(target).removeprefix(str(root) + "/"))):
                continue
            con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet('{target}', union_by_name=true)")
    finally:
        con.close()
    tmp.replace(db)
