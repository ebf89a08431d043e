"""Another job's validated table as a job's input (``input.from_job``): the second pass of a multi-pass job.

The rows are the upstream's validated rows that pass ``input.where`` / ``input.confidence_below`` (a SQL
condition over the validated columns, checked before anything is read: a column the table does not have is a
``ConfigError`` naming it). Each keeps the upstream's row identity, its ``(source, line, source_key)``, so the
passes of a source row line up (the ``cascade`` view, ``core/publish/cascade.py``). The template may use the
upstream's answer and validated columns (``UPSTREAM_FIELDS``: ``{output}``, ...) and any field of the upstream's
own input rows, read from the upstream's input for the lines that pass.

Each upstream source file is one input of this job (an ``InputFile`` with its own ``reader``), so the incremental
manifest works as for files: the identity is the upstream validated table's size and modification time, mixed
with a digest of the condition and the fields, so a new upstream publish (or a changed filter) reads the sources
again, and the ordinary dedup makes new items only of rows whose request changed. The request ID hashes the
upstream's answer as well (``ids.with_upstream``), so a changed upstream answer re-runs that row only, even when
the template does not show the answer.

Upstream specs are found by name beside this job's spec: in the same jobs folder, or, for a job of the project's
own, in either of its two places (the jobs folder and the dg defs folder's ``defs.yaml`` Components;
``core/spec/job_files.sibling_job_files``).
"""

import hashlib
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache
from typing import TYPE_CHECKING

import duckdb
import polars as pl
import pyarrow as pa

from batch_pipeline.core.errors import ConfigError, InputError
from batch_pipeline.core.ledger.result_parts import read_results
from batch_pipeline.core.manifest import ids
from batch_pipeline.core.manifest.inputs import read_batches, resolve_inputs
from batch_pipeline.core.manifest.read import VALIDATED_SCHEMA
from batch_pipeline.core.manifest.rows import KEY, LINE, InputFile, Reject, RowBatch
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.spec.job_files import load_job_file, sibling_job_files
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store

if TYPE_CHECKING:
    import pyarrow.dataset

log = logging.getLogger(__name__)

# template fields taken from the upstream's validated row (the others come from its input rows)
UPSTREAM_FIELDS = ("output", "output_text", "model", "prompt_version", "finish_reason", "source_key")
BLOCK_ROWS = 65_536
_MISSING_COLUMN = re.compile(r'Referenced column "([^"]+)" not found')


class ShareSource(str, Enum):
    """Where a filtered pass's share of the upstream rows comes from."""

    ASSUMED = "assumed"  # input.assumed_share: nothing of the upstream is answered yet
    CANARY = "canary"  # the upstream's answers so far (its canary first), before it published
    VALIDATED = "validated"  # the upstream's published validated table


@dataclass(frozen=True)
class PassShare:
    share: float
    source: ShareSource
    measured_on: int  # upstream rows (or answers) the share was measured on; 0 when assumed

    def as_dict(self) -> dict:
        return {"share": round(self.share, 6), "source": self.source.value, "measured_on": self.measured_on}


# -- the chain of jobs ---------------------------------------------------------------------------
def sibling_specs(spec: JobSpec) -> dict[str, JobSpec]:
    """Every job spec beside this one (``sibling_job_files``), by name; of two under one name, the one in this
    spec's own place; a spec that does not load is left out, with a warning."""
    if spec.source_path is None:
        return {spec.name: spec}
    listing = tuple((str(p), p.stat().st_mtime_ns) for p in sibling_job_files(spec.source_path))
    return {**_load_files(listing), spec.name: spec}


@lru_cache(maxsize=16)
def _load_files(listing: tuple[tuple[str, int], ...]) -> dict[str, JobSpec]:
    """The specs of a listing of spec files (path, mtime): loaded once per version of the files."""
    out: dict[str, JobSpec] = {}
    for path, _ in listing:
        try:
            other = load_job_file(path)
        except ConfigError as exc:
            log.warning("multi-pass: %s does not load, left out: %s", path, str(exc).splitlines()[0])
            continue
        out.setdefault(other.name, other)
    return out


def upstream_spec(spec: JobSpec) -> JobSpec:
    name = spec.input.from_job
    if name is None:
        raise ValueError(f"job {spec.name} does not read another job's table")
    found = sibling_specs(spec).get(name)
    if found is None:
        raise ConfigError(
            f"{spec.source_path or spec.name}: input.from_job names job {name!r}, which has no spec "
            "in the same jobs folder (or the project's defs folder)"
        )
    return found


def chain(spec: JobSpec) -> list[JobSpec]:
    """The passes that lead to ``spec``, the first (a job reading files) first and ``spec`` last."""
    out = [spec]
    while out[0].input.from_job is not None:
        up = upstream_spec(out[0])
        if any(s.name == up.name for s in out):
            raise ConfigError(f"input.from_job makes a cycle: {' <- '.join(s.name for s in [*out, up])}")
        out.insert(0, up)
    return out


def downstream_specs(spec: JobSpec) -> list[JobSpec]:
    """The jobs that read ``spec``'s validated table (the next passes), by name."""
    return [s for name, s in sorted(sibling_specs(spec).items()) if s.input.from_job == spec.name]


# -- the filter ----------------------------------------------------------------------------------
def condition_sql(spec: JobSpec, upstream: JobSpec) -> str:
    """The row filter as one SQL condition over the upstream's validated columns (``true`` without one)."""
    source = spec.input
    parts = []
    if source.where is not None:
        parts.append(f"({source.where})")
    if source.confidence_below is not None:
        conf = source.confidence_below
        props = (upstream.output.json_schema or {}).get("properties", {})
        if upstream.output.kind != "json_schema" or conf.field not in props:
            have = sorted(props) if upstream.output.kind == "json_schema" else f"a {upstream.output.kind} output"
            raise ConfigError(
                f"{spec.source_path or spec.name}: input.confidence_below.field {conf.field!r} is not a "
                f"field of job {upstream.name}'s JSON output (it has {have})"
            )
        value = f"TRY_CAST(json_extract_string(output, '$.{conf.field}') AS DOUBLE)"
        parts.append(f"COALESCE({value} < {float(conf.threshold)!r}, true)")
    return " AND ".join(parts) or "true"


def check_condition(spec: JobSpec, condition: str, schema: pa.Schema) -> None:
    """Bind the condition against an empty table of the validated columns: a bad column (or SQL) is a
    ``ConfigError`` that names it, before anything is read."""
    where = f"{spec.source_path or spec.name}: input.where"
    sql = f"SELECT count(*) FROM upstream WHERE {condition}"
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise ConfigError(f"{where} is not a SQL condition: {_first_line(exc)}") from None
    if len(statements) != 1:
        raise ConfigError(f"{where} must be one condition, not several statements")
    con = duckdb.connect()
    try:
        con.register("upstream", pa.Table.from_batches([], schema=schema))
        con.execute(sql)
    except duckdb.BinderException as exc:
        missing = _MISSING_COLUMN.search(str(exc))
        if missing:
            raise ConfigError(
                f"{where}: no column {missing.group(1)!r} in job {spec.input.from_job}'s validated "
                f"table (its columns: {', '.join(schema.names)})"
            ) from None
        raise ConfigError(f"{where}: {_first_line(exc)}") from None
    except duckdb.Error as exc:
        raise ConfigError(f"{where} is not a valid condition: {_first_line(exc)}") from None
    finally:
        con.close()


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0]


def checked_condition(spec: JobSpec, upstream: JobSpec | None = None) -> str:
    """``condition_sql`` checked against the validated columns (no upstream table needed)."""
    upstream = upstream or upstream_spec(spec)
    condition = condition_sql(spec, upstream)
    check_condition(spec, condition, VALIDATED_SCHEMA)
    return condition


# -- the inputs ----------------------------------------------------------------------------------
def job_inputs(spec: JobSpec, store: Store) -> list[InputFile]:
    """The inputs of any job: its files, or one input per source file of its upstream's validated table."""
    if spec.input.from_job is None:
        assert spec.input.path is not None
        return resolve_inputs(spec.input.path, spec.input.format, spec.input_base_dir())
    return UpstreamTable(spec, store).inputs()


class UpstreamTable:
    """The upstream's validated table, filtered, as this job's inputs."""

    def __init__(self, spec: JobSpec, store: Store):
        self.spec, self.store = spec, store
        self.upstream = upstream_spec(spec)
        self.rel = JobPaths(self.upstream.name).validated
        self.condition = checked_condition(spec, self.upstream)

    def published(self) -> bool:
        return self.store.exists(self.rel)

    def _dataset(self) -> "pyarrow.dataset.Dataset":
        return self.store.dataset(self.rel)

    def _query(self, sql: str, params: list | None = None) -> pl.DataFrame:
        con = duckdb.connect()
        try:
            con.register("upstream", self._dataset())
            frame = pl.from_arrow(con.sql(sql, params=params or None).to_arrow_table())
        finally:
            con.close()
        assert isinstance(frame, pl.DataFrame)
        return frame

    def inputs(self) -> list[InputFile]:
        if not self.published():
            raise InputError(
                f"input.from_job: job {self.upstream.name} has not published a validated table yet "
                f"({self.store.uri(self.rel)}); run it first"
            )
        info = self.store.fs.get_file_info(self.store.full(self.rel))
        fields = self.spec.prompt.fields
        digest = hashlib.sha256("\x1f".join([self.condition, *fields]).encode()).hexdigest()
        identity = (info.mtime_ns or 0) ^ int(digest[:15], 16)  # a changed filter reads every source again
        sources = self._query("SELECT DISTINCT source FROM upstream ORDER BY source")["source"].to_list()
        return [
            InputFile(
                source,
                self.store.fs,
                self.store.full(self.rel),
                "parquet",
                info.size,
                identity,
                reader=self._reader(source),
            )
            for source in sources
        ]

    def _reader(self, source: str):
        def read(fields: list[str], key_field: str | None) -> Iterator[RowBatch]:
            yield from self.batches(source, fields)

        return read

    def rows(self, source: str | None = None) -> pl.DataFrame:
        """The upstream rows that pass the filter (of one source): every validated column."""
        where = "source = ? AND " if source is not None else ""
        return self._query(
            f"SELECT * FROM upstream WHERE {where}({self.condition}) ORDER BY source, line",
            [source] if source is not None else [],
        )

    def batches(self, source: str, fields: list[str]) -> Iterator[RowBatch]:
        """The rows of one upstream source that pass: the template's fields (as text), line, key, answer."""
        rows = self.rows(source)
        own = [f for f in fields if f not in UPSTREAM_FIELDS]
        rejects: list[Reject] = []
        if own and rows.height:
            rows, rejects = self._with_input_fields(source, rows, own)
        frame = rows.select(
            *[pl.col(f).cast(pl.String) for f in fields if f in UPSTREAM_FIELDS],
            *[pl.col(f) for f in own],
            pl.col("line").cast(pl.Int64).alias(LINE),
            pl.col("source_key").cast(pl.String).alias(KEY),
            pl.col("output").cast(pl.String).fill_null("").alias(ids.UPSTREAM_OUTPUT),
        ).select([*fields, LINE, KEY, ids.UPSTREAM_OUTPUT])
        if frame.height == 0:
            yield RowBatch(source, frame, rejects)
            return
        for start in range(0, frame.height, BLOCK_ROWS):
            yield RowBatch(source, frame.slice(start, BLOCK_ROWS), rejects if start == 0 else [])

    def _with_input_fields(self, source: str, rows: pl.DataFrame, own: list[str]) -> tuple[pl.DataFrame, list[Reject]]:
        """Join the upstream's own input fields to its rows, by line; a row whose field is missing is a reject."""
        upstream_file = next((f for f in job_inputs(self.upstream, self.store) if f.uri == source), None)
        if upstream_file is None:
            raise InputError(
                f"input.from_job: job {self.upstream.name}'s validated rows name {source}, which is "
                "no longer one of its inputs; run it again first"
            )
        lines = rows.select(pl.col("line").cast(pl.Int64).alias(LINE))
        frames, rejects = [], []
        wanted = set(lines[LINE].to_list())
        for batch in read_batches(upstream_file, own, None):
            frames.append(batch.frame.select([*own, LINE]).join(lines, on=LINE, how="semi"))
            rejects.extend(r for r in batch.rejects if r.line in wanted)
        fields = pl.concat(frames) if frames else pl.DataFrame(schema={**{f: pl.String for f in own}, LINE: pl.Int64})
        joined = rows.with_columns(pl.col("line").cast(pl.Int64).alias(LINE)).join(fields, on=LINE, how="left")
        rejected = {r.line for r in rejects}
        missing = joined.filter(pl.any_horizontal([pl.col(f).is_null() for f in own]))
        for line in missing[LINE].to_list():
            if line not in rejected:
                rejects.append(
                    Reject(
                        source,
                        line,
                        own[0],
                        "missing_field",
                        f"line {line} of job {self.upstream.name}'s input no longer has the fields {own}",
                    )
                )
        return joined.filter(~pl.any_horizontal([pl.col(f).is_null() for f in own])).drop(LINE), rejects

    # -- the share that passes (for quotes) ------------------------------------------------------
    def share(self) -> PassShare:
        """The share of the upstream's rows that pass the filter: measured on its validated table once it has
        published, on its answers so far (its canary first) before that, assumed until anything is answered."""
        if self.published():
            counts = self._query(f"SELECT count(*) AS n, count(*) FILTER (WHERE {self.condition}) AS k FROM upstream")
            n, k = counts.row(0)
            if n:
                return PassShare(k / n, ShareSource.VALIDATED, n)
        answers = self._answers()
        if answers.height:
            con = duckdb.connect()
            try:
                con.register("upstream", answers.to_arrow())
                n, k = con.execute(
                    f"SELECT count(*), count(*) FILTER (WHERE {self.condition}) FROM upstream"
                ).fetchone()  # type: ignore[misc]
            finally:
                con.close()
            if n:
                return PassShare(k / n, ShareSource.CANARY, n)
        return PassShare(self.spec.input.assumed_share, ShareSource.ASSUMED, 0)

    def _answers(self) -> pl.DataFrame:
        """The upstream's latest valid answer per request so far, as rows of the validated columns."""
        schema = VALIDATED_SCHEMA
        got = read_results(
            self.store,
            self.upstream.name,
            columns=["request_id", "attempt", "status", "parsed_output", "model", "prompt_version"],
        )
        if got.height == 0:
            return pl.DataFrame()
        latest = (
            got.filter(pl.col("status") == "succeeded")
            .sort("attempt")
            .unique("request_id", keep="last")
            .rename({"parsed_output": "output"})
        )
        empty = pl.from_arrow(pa.Table.from_batches([], schema=schema))
        assert isinstance(empty, pl.DataFrame)
        have = [c for c in empty.columns if c in latest.columns]
        return pl.concat([empty, latest.select(have)], how="diagonal_relaxed").select(empty.columns)
