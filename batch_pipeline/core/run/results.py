"""Append-only results: one row per outcome of one request in one attempt.

Rows are written as Parquet parts per (shard, attempt, flush) and never changed. A re-collected
attempt (after a crash mid-collection) may write the same rows again; readers keep one row per
(request_id, attempt), so a repeat changes nothing. Parts written before a column existed stay readable:
``read_results`` fills it (``LATER_COLUMNS``: cache_write_tokens reads as 0, as those parts priced every
input token at the input rate).
"""

import uuid
from datetime import UTC, datetime

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from batch_pipeline.core.money.cost import Price
from batch_pipeline.core.run.executor import RAW_OPTIONAL_SCHEMA, RAW_RESULT_SCHEMA, ShardWork
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline.core.quality.validate import validate

TS = pa.timestamp("us", tz="UTC")
RESULT_SCHEMA = pa.schema([
    ("request_id", pa.string()), ("shard_id", pa.string()), ("attempt", pa.int32()),
    ("backend", pa.string()), ("pricing", pa.string()), ("model", pa.string()), ("prompt_version", pa.string()),
    ("status", pa.string()), ("output_text", pa.string()), ("parsed_output", pa.string()),
    ("finish_reason", pa.string()), ("input_tokens", pa.int64()), ("cached_tokens", pa.int64()),
    ("cache_write_tokens", pa.int64()), ("output_tokens", pa.int64()), ("cost_usd", pa.float64()),
    ("error_class", pa.string()), ("error_code", pa.string()), ("error_message", pa.string()),
    ("provider_batch_id", pa.string()), ("provider_request_id", pa.string()), ("raw_payload", pa.string()),
    ("recorded_at", TS),
])
# columns added after parts were first written, with the value an older part reads as
LATER_COLUMNS = {"cache_write_tokens": 0}
_POLARS_SCHEMA = pl.from_arrow(RESULT_SCHEMA.empty_table()).schema


def build_results(raw: pa.Table, work: ShardWork, *, backend: str, pricing: str, prompt_version: str,
                  price: Price | None, provider_batch_id: str | None) -> pa.Table:
    """Validate raw provider rows and stamp them with their attempt, cost (``Price.cost``) and provenance."""
    n = raw.num_rows
    zeros = pa.repeat(pa.scalar(0, pa.int64()), n)
    write_type = RAW_OPTIONAL_SCHEMA.field("cache_write_tokens").type
    writes = (pc.fill_null(raw.column("cache_write_tokens").cast(write_type), 0)
              if "cache_write_tokens" in raw.column_names else zeros)  # absent: the backend bills no cache writes
    raw = raw.select(RAW_RESULT_SCHEMA.names).cast(RAW_RESULT_SCHEMA)
    verdicts = validate(raw, work.plan.output)
    in_tok = pc.fill_null(raw.column("input_tokens"), 0)
    cached = pc.fill_null(raw.column("cached_tokens"), 0)
    out_tok = pc.fill_null(raw.column("output_tokens"), 0)
    if price is not None and n:
        def f64(col) -> np.ndarray:
            return col.to_numpy().astype(np.float64)

        cost = pa.array(price.cost(f64(in_tok), f64(out_tok), cached_tokens=f64(cached), batch=pricing == "batch",
                                   cache_write_tokens=f64(writes)), pa.float64())
    else:
        cost = pa.repeat(pa.scalar(0.0, pa.float64()), n)
    now = datetime.now(UTC)

    def const(value, typ=pa.string()):
        return pa.repeat(pa.scalar(value, typ), n)  # filled in C++, no Python list of n values

    return pa.Table.from_arrays([
        raw.column("request_id"), const(work.shard_id), const(work.attempt, pa.int32()),
        const(backend), const(pricing), const(work.plan.model), const(prompt_version),
        verdicts.status, raw.column("output_text"), verdicts.parsed_output, raw.column("finish_reason"),
        in_tok if n else zeros, cached if n else zeros, writes, out_tok if n else zeros, cost,
        verdicts.error_class, pc.coalesce(verdicts.error_code, raw.column("error_code")) if n else verdicts.error_code,
        verdicts.error_message, const(provider_batch_id), raw.column("provider_request_id"), raw.column("raw_payload"),
        const(now, TS),
    ], schema=RESULT_SCHEMA)


# Columns whose values are (nearly) all distinct: Parquet's dictionary encoding of them is built and then thrown
# away, and their min/max statistics prune nothing, so both are switched off for them (measured: -6% write CPU,
# files no larger). The verbatim provider lines are ~850 bytes each and most of a part's bytes: LZ4 writes them
# at about twice zstd's speed (-0.3 CPU s per 1M lines) for parts about twice as large (~270 MB per 1M lines).
_UNIQUE_COLUMNS = {"request_id", "provider_request_id", "raw_payload"}
PART_OPTIONS = {"compression": {c: "lz4" if c == "raw_payload" else "zstd" for c in RESULT_SCHEMA.names},
                "use_dictionary": [c for c in RESULT_SCHEMA.names if c not in _UNIQUE_COLUMNS],
                "write_statistics": [c for c in RESULT_SCHEMA.names if c not in _UNIQUE_COLUMNS]}


def write_results(store: Store, job: str, shard_id: str, attempt: int, flush: int, table: pa.Table) -> str:
    rel = JobPaths(job).result_part(shard_id, attempt, flush, uuid.uuid4().hex[:8])
    store.write_table(rel, table, **PART_OPTIONS)
    return rel


def read_results(store: Store, job: str, shard_id: str | None = None, columns: list[str] | None = None) -> pl.DataFrame:
    """Every stored result row, one per (request_id, attempt). A column a part predates (``LATER_COLUMNS``)
    reads as its fill value."""
    paths = JobPaths(job)
    where = f"{paths.results}/{shard_id}" if shard_id else paths.results
    cols = columns if columns is None or {"request_id", "attempt"} <= set(columns) else \
        list(dict.fromkeys(["request_id", "attempt", *columns]))
    parts = store.list_files(where, recursive=True, suffix=".parquet")
    frame = _scan_parts(store, parts, cols)
    if frame is None:  # a torn part, parts of differing schemas, or not on local disk: part by part
        tables = []
        for rel in parts:
            t = _read_part(store, rel, cols)
            if t is not None and t.num_rows:
                tables.append(t)
        if not tables:
            frame = pl.from_arrow(pa.Table.from_batches([], schema=_schema(cols)))
        else:
            frame = pl.from_arrow(pa.concat_tables(tables, promote_options="permissive"))
    assert isinstance(frame, pl.DataFrame)
    frame = _fill_later_columns(frame, cols)
    # a re-collected attempt may have written the same rows twice; distinct hashes rule that out cheaply
    if frame.height and frame.select(pl.struct(pl.col("request_id").hash(), "attempt").is_duplicated().any()).item():
        frame = frame.unique(subset=["request_id", "attempt"], keep="first", maintain_order=True)
    return frame


def _schema(cols: list[str] | None) -> pa.Schema:
    return RESULT_SCHEMA if cols is None else pa.schema([RESULT_SCHEMA.field(c) for c in cols])


def _read_part(store: Store, rel: str, cols: list[str] | None) -> pa.Table | None:
    """One part; a later column it predates is left out of the read (asking Parquet for it would fail the read,
    and the store would drop the whole part as torn) and filled afterwards."""
    later = [c for c in cols or [] if c in LATER_COLUMNS]
    if not later:
        return store.read_part(rel, cols)
    assert cols is not None
    try:
        with store.fs.open_input_file(store.full(rel)) as f:
            names = set(pq.read_schema(f).names)
    except (pa.ArrowInvalid, OSError):
        return store.read_part(rel, cols)  # missing or torn: the store says so
    return store.read_part(rel, [c for c in cols if c in names or c not in LATER_COLUMNS])


def _fill_later_columns(frame: pl.DataFrame, cols: list[str] | None) -> pl.DataFrame:
    """Later columns absent from every part read, or null in the rows of older parts: their fill value, in the
    order the caller asked for."""
    wanted = RESULT_SCHEMA.names if cols is None else cols
    fills = []
    for name, value in LATER_COLUMNS.items():
        if name not in wanted:
            continue
        if name not in frame.columns:
            fills.append(pl.lit(value, _POLARS_SCHEMA[name]).alias(name))
        elif frame[name].null_count():
            fills.append(pl.col(name).fill_null(value))
    if not fills:
        return frame
    return frame.with_columns(fills).select(wanted)


def _scan_parts(store: Store, parts: list[str], cols: list[str] | None) -> pl.DataFrame | None:
    """All parts in one parallel Polars scan (local store); None when that fails or the parts differ. Parts
    written before a later column existed get it as nulls (``_fill_later_columns`` fills them)."""
    if not parts or not store.is_local:
        return None
    expected = _POLARS_SCHEMA if cols is None else pl.Schema({c: _POLARS_SCHEMA[c] for c in cols})
    paths = [str(store.local_path(rel)) for rel in parts]

    def scan(**options) -> pl.DataFrame | None:
        try:
            lazy = pl.scan_parquet(paths, **options)
            frame = (lazy.select(cols) if cols is not None else lazy).collect()
        except Exception:  # noqa: BLE001 - any failure: the part-by-part path skips torn parts with a warning
            return None
        return frame if frame.schema == expected else None

    # parts that predate a later column: scanned against the full schema, the column inserted as nulls
    frame = scan()
    return frame if frame is not None else scan(schema=_POLARS_SCHEMA, missing_columns="insert")
