"""The published outputs: the validated table (one row per source row), dead letters, DuckDB views.

Publishing is two steps so that a gate can sit between them: ``stage`` writes the table and the dead
letters under ``staged/`` (where the blocking checks read them), ``promote`` copies the staged files to
``validated/`` (where users read them) and refreshes the DuckDB views. A failed check means no promotion:
the previous validated table stays as it was.

Both are built streaming, whatever the job's size: the table by DuckDB over the Parquet files
(``validated.py``), the dead letters and the report's figures by one pass a group of shards at a time
(``scan.py``). ``JobState`` still offers the job's items, results and states as whole frames, read on first use,
for the callers that need every row (quotes, evals, replays).
"""

import logging
from functools import cached_property

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from batch_pipeline.core.ledger.reconcile import Counts, item_states
from batch_pipeline.core.ledger.replay import Replays
from batch_pipeline.core.ledger.result_parts import PART_SCHEMA, read_results
from batch_pipeline.core.manifest.read import VALIDATED_COLUMNS
from batch_pipeline.core.manifest.shards import Manifest
from batch_pipeline.core.money.pending import QuoteBasis
from batch_pipeline.core.publish.cascade import cascade_view
from batch_pipeline.core.publish.scan import JobScan, scanned
from batch_pipeline.core.publish.validated import write_validated
from batch_pipeline.core.quality.golden import GoldenProbes
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store

log = logging.getLogger(__name__)

__all__ = ["VALIDATED_COLUMNS", "JobState", "dead_letters", "promote", "stage", "write_duckdb_views"]


class JobState:
    """The job as the store has it. ``scan`` (one pass, a group of shards at a time) serves publishing, the report
    and ``check``; ``items``, ``results`` and ``states`` (every row; results without their raw payload) are read
    on first use only."""

    def __init__(self, spec: JobSpec, store: Store):
        self.spec, self.store = spec, store

    @classmethod
    def load(cls, spec: JobSpec, store: Store) -> "JobState":
        return cls(spec, store)

    @cached_property
    def scan(self) -> JobScan:
        return scanned(self.spec, self.store)  # the same pass for every step of a publish in one process

    def check(self) -> Counts:
        """``expected = valid + invalid + missing + dead_lettered`` per shard and per job, from independent sets."""
        return self.scan.check()

    @cached_property
    def _frames(self) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame | None]:
        """Items and their results; golden probe results kept apart (they are not items of the job)."""
        spec, store = self.spec, self.store
        items = pl.from_arrow(Manifest(spec.name, store).item_index())
        assert isinstance(items, pl.DataFrame)
        results = read_results(store, spec.name, columns=PART_SCHEMA.names)
        probes = None
        if spec.quality is not None:
            ids = GoldenProbes(spec, store).all_probe_ids().select("request_id")
            if ids.height:
                probes = results.join(ids, on="request_id", how="semi")
                results = results.join(ids, on="request_id", how="anti")
        states = item_states(items, results, spec.retries, Replays(store, spec.name).table())
        return items, results, states, probes

    @property
    def items(self) -> pl.DataFrame:
        return self._frames[0]

    @property
    def results(self) -> pl.DataFrame:
        return self._frames[1]

    @property
    def states(self) -> pl.DataFrame:
        return self._frames[2]

    @property
    def probe_results(self) -> pl.DataFrame | None:
        return self._frames[3]

    def quote_basis(self) -> QuoteBasis:
        """Every item, its results and its state: what a routed job's quote prices."""
        return QuoteBasis(self.items, self.results, self.states)


def dead_letters(state: JobState) -> pl.DataFrame:
    return state.scan.dead_letters


def stage(spec: JobSpec, store: Store, state: JobState | None = None) -> dict[str, str]:
    """Write the staged table and dead letters (each replaced atomically); nothing users read changes."""
    paths = JobPaths(spec.name)
    state = state or JobState.load(spec, store)
    rows = write_validated(spec, store, paths.staged)
    store.write_table(paths.staged_dead_letters, dead_letters(state).to_arrow())
    log.info("staged %d rows of job %s", rows, spec.name)
    return {"staged": store.uri(paths.staged), "staged_dead_letters": store.uri(paths.staged_dead_letters)}


def promote(spec: JobSpec, store: Store) -> dict[str, str]:
    """Copy the staged files to validated/ byte for byte (each write atomic) and refresh the DuckDB views."""
    paths = JobPaths(spec.name)
    missing = [rel for rel in (paths.staged, paths.staged_dead_letters) if not store.exists(rel)]
    if missing:
        raise FileNotFoundError(f"nothing staged to promote for job {spec.name}: {', '.join(missing)} missing")
    store.copy(paths.staged_dead_letters, paths.dead_letters)
    store.copy(paths.staged, paths.validated)
    out = {"validated": store.uri(paths.validated), "dead_letters": store.uri(paths.dead_letters)}
    db = store.local_path(paths.duckdb)
    if db is not None:
        cascade = cascade_view(spec, store)  # a later pass of a multi-pass job: the passes merged
        write_duckdb_views(store, spec.name, [cascade] if cascade else None)
        out["duckdb"] = str(db)
    return out


def write_duckdb_views(store: Store, job: str, extra_views: list[str] | None = None) -> None:
    """A DuckDB file of views over the job's Parquet files, for ad-hoc SQL (local stores); ``extra_views``:
    more ``CREATE VIEW`` statements (the ``cascade`` view of a multi-pass job)."""
    paths = JobPaths(job)
    db = store.local_path(paths.duckdb)
    assert db is not None
    root = store.local_path(paths.root)
    live = Manifest(job, store).live_parts()
    views = {
        "validated": store.local_path(paths.validated),
        "dead_letters": store.local_path(paths.dead_letters),
        "results": f"{root}/results/*/*.parquet",
        "payloads": f"{root}/payloads/*/*.parquet",  # the raw provider lines, by (request_id, attempt)
        "items": f"{root}/manifest/items/*.parquet",
    }
    # an incremental manifest keeps each file's live rows (and rejects) in the generation that read them
    live_views = {
        "source_rows": _live_select(store, paths.rows, live),
        "rejects": _live_select(store, paths.rejects, live),
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
            con.execute(
                f"CREATE VIEW {name} AS SELECT *{_vector_columns(target)} "
                f"FROM read_parquet('{target}', union_by_name=true)"
            )
        for name, select in live_views.items():
            if select:
                con.execute(f"CREATE VIEW {name} AS {select}")
        for statement in extra_views or []:
            con.execute(statement)
    finally:
        con.close()
    tmp.replace(db)


def _live_select(store: Store, path_of, live: dict[int, list[str]]) -> str | None:
    """The live rows across generations (``Manifest.live_parts``): each generation's part, filtered to the sources
    whose rows it still holds; None when no part exists yet."""
    selects = []
    for gen, sources in sorted(live.items()):
        part = store.local_path(path_of(gen))
        if part is None or not part.exists():
            continue
        where = ""
        if sources:
            quoted = ", ".join("'" + s.replace("'", "''") + "'" for s in sources)
            where = f" WHERE source IN ({quoted})"
        selects.append(f"SELECT * FROM read_parquet('{part}'){where}")
    return " UNION ALL BY NAME ".join(selects) or None


def _vector_columns(target) -> str:
    """`` REPLACE (embedding::FLOAT[N] AS embedding)`` for a file whose fixed-size float lists DuckDB would read
    as variable-length ones: as FLOAT[N], ``array_cosine_similarity`` and the other array functions work on the
    view. Empty for other files (and globs)."""
    if "*" in str(target):
        return ""
    fields = [f for f in pq.read_schema(str(target)) if pa.types.is_fixed_size_list(f.type)]
    if not fields:
        return ""
    casts = ", ".join(f'"{f.name}"::FLOAT[{f.type.list_size}] AS "{f.name}"' for f in fields)
    return f" REPLACE ({casts})"
