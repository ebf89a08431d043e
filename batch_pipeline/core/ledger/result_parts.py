"""Append-only results: one row per outcome of one request in one attempt.

Rows are written per (shard, attempt, flush) and never changed, as two Parquet parts of one name: the result part
(``results/``: the parsed, validated columns that every decision, check and report reads) and the payload part
(``payloads/``: request_id, attempt and the provider's line verbatim, ~850 of a row's ~900 bytes). The payload is
kept and can be parsed again by the executor's format, but no read of the results pays for it: ``read_results``
joins it in only when ``raw_payload`` is asked for, and the ingest writes it on its own thread while the row is
validated. A re-collected attempt (after a crash mid-collection) may write the same rows again; readers keep one row
per (request_id, attempt), so a repeat changes nothing. Parts written before a column existed stay readable:
``read_results`` fills it (``LATER_COLUMNS``: cache_write_tokens reads as 0, as those parts priced every input token
at the input rate; embedding, an embeddings job's vector, as null), and a result part written before the split (its
payload inside) gives its own payload.
"""

import uuid
from concurrent.futures import Future

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store, empty_table, parquet_bytes

STRING = pa.string()  # the default column type of a constant column

TS = pa.timestamp("us", tz="UTC")
RESULT_SCHEMA = pa.schema(
    [
        ("request_id", pa.string()),
        ("shard_id", pa.string()),
        ("attempt", pa.int32()),
        ("backend", pa.string()),
        ("pricing", pa.string()),
        ("model", pa.string()),
        ("prompt_version", pa.string()),
        ("status", pa.string()),
        ("output_text", pa.string()),
        ("parsed_output", pa.string()),
        ("finish_reason", pa.string()),
        ("input_tokens", pa.int64()),
        ("cached_tokens", pa.int64()),
        ("cache_write_tokens", pa.int64()),
        ("output_tokens", pa.int64()),
        ("cost_usd", pa.float64()),
        ("error_class", pa.string()),
        ("error_code", pa.string()),
        ("error_message", pa.string()),
        ("provider_batch_id", pa.string()),
        ("provider_request_id", pa.string()),
        ("raw_payload", pa.string()),
        ("recorded_at", TS),
        ("embedding", pa.list_(pa.float32())),  # an embeddings job's vector (null for other jobs)
    ]
)
PAYLOAD = "raw_payload"
# what a result part holds: every column but the payload
PART_SCHEMA = pa.schema([f for f in RESULT_SCHEMA if f.name != PAYLOAD])
# what a payload part holds, row for row beside its result part
PAYLOAD_SCHEMA = pa.schema(
    [RESULT_SCHEMA.field("request_id"), RESULT_SCHEMA.field("attempt"), RESULT_SCHEMA.field(PAYLOAD)]
)
# columns added after parts were first written, with the value an older part reads as
LATER_COLUMNS = {"cache_write_tokens": 0, "embedding": None}
_POLARS_SCHEMA = pl.from_arrow(empty_table(RESULT_SCHEMA)).schema


_UNIQUE_COLUMNS = {"request_id", "provider_request_id", PAYLOAD}
PART_OPTIONS = {
    "compression": {c: "zstd" if c in _UNIQUE_COLUMNS else "lz4" for c in PART_SCHEMA.names},
    "use_dictionary": [c for c in PART_SCHEMA.names if c not in _UNIQUE_COLUMNS],
    "write_statistics": [c for c in PART_SCHEMA.names if c not in _UNIQUE_COLUMNS],
}
# Payload parts: zstd at level -7 (measured per 5,000 rows of ~850-byte lines: write 2.8-3.1 ms and 969 KiB against
# LZ4's 3.8-3.9 ms and 1,020 KiB, read 0.5 against 3.0 ms; zstd level 1 halves the size for 4.4-4.7 ms).
PAYLOAD_OPTIONS = {"compression": "zstd", "compression_level": -7, "use_dictionary": False, "write_statistics": False}


def new_part(job: str, shard_id: str, attempt: int, flush: int) -> str:
    """The name of a new result part; its payload part is ``JobPaths.payload_part`` of it."""
    return JobPaths(job).result_part(shard_id, attempt, flush, uuid.uuid4().hex[:8])


def write_payload(store: Store, job: str, rel: str, attempt: int, rows: pa.Table) -> None:
    """The payload part of result part ``rel``: ``rows``' request_id and raw_payload, in the same order."""
    n = rows.num_rows
    table = pa.Table.from_arrays(
        [rows.column("request_id"), pa.repeat(pa.scalar(attempt, pa.int32()), n), rows.column(PAYLOAD)],
        schema=PAYLOAD_SCHEMA,
    )
    store.write_table(JobPaths(job).payload_part(rel), table, **PAYLOAD_OPTIONS)


def write_part(store: Store, rel: str, table: pa.Table, after: Future | None = None) -> None:
    """Result part ``rel``: a ``build_results`` table without its payload. Encoded at once, made visible only once
    ``after`` (its payload part's write, on another thread) has landed."""
    data = parquet_bytes(table.select(PART_SCHEMA.names), **PART_OPTIONS)
    if after is not None:
        after.result()  # raises if the payload was not written: then neither part is
    store.write_bytes(rel, data)


def write_results(store: Store, job: str, shard_id: str, attempt: int, flush: int, table: pa.Table) -> str:
    """Both parts of one flush, the payload first (a result part is never visible without its payload)."""
    rel = new_part(job, shard_id, attempt, flush)
    write_payload(store, job, rel, attempt, table)
    write_part(store, rel, table)
    return rel


def read_results(store: Store, job: str, shard_id: str | None = None, columns: list[str] | None = None) -> pl.DataFrame:
    """Every stored result row, one per (request_id, attempt); every column of ``RESULT_SCHEMA`` by default. A
    column a part predates (``LATER_COLUMNS``) reads as its fill value; ``raw_payload`` is read from the payload
    parts only when asked for (or by default)."""
    paths = JobPaths(job)
    where = f"{paths.results}/{shard_id}" if shard_id else paths.results
    cols = (
        RESULT_SCHEMA.names
        if columns is None
        else (
            columns
            if {"request_id", "attempt"} <= set(columns)
            else list(dict.fromkeys(["request_id", "attempt", *columns]))
        )
    )
    parts = store.list_files(where, recursive=True, suffix=".parquet")
    frame = read_parts(store, parts, [c for c in cols if c != PAYLOAD])
    if PAYLOAD not in cols:
        return frame
    payloads = _read_payloads(store, job, shard_id, parts)
    return frame.join(payloads, on=["request_id", "attempt"], how="left", maintain_order="left").select(cols)


def result_parts(store: Store, job: str) -> dict[str, list[str]]:
    """Every result part of the job, by shard, from one listing (for reads a group of shards at a time)."""
    results = JobPaths(job).results
    out: dict[str, list[str]] = {}
    for rel in store.list_files(results, recursive=True, suffix=".parquet"):
        out.setdefault(rel[len(results) + 1 :].split("/", 1)[0], []).append(rel)
    return out


def read_parts(store: Store, parts: list[str], columns: list[str]) -> pl.DataFrame:
    """``read_results`` over the given result parts (``raw_payload`` aside): one row per (request_id, attempt)."""
    assert PAYLOAD not in columns and {"request_id", "attempt"} <= set(columns)
    frame = _fill_later_columns(_read_frame(store, parts, columns), columns)
    # a re-collected attempt may have written the same rows twice; distinct hashes rule that out cheaply
    return _unique_rows(frame)


def _unique_rows(frame: pl.DataFrame) -> pl.DataFrame:
    if frame.height and frame.select(pl.struct(pl.col("request_id").hash(), "attempt").is_duplicated().any()).item():
        return frame.unique(subset=["request_id", "attempt"], keep="first", maintain_order=True)
    return frame


def _read_payloads(store: Store, job: str, shard_id: str | None, result_parts: list[str]) -> pl.DataFrame:
    """(request_id, attempt, raw_payload) of the payload parts, and of result parts written before the split (those
    have no payload part and carry the column themselves)."""
    paths = JobPaths(job)
    where = f"{paths.payloads}/{shard_id}" if shard_id else paths.payloads
    parts = store.list_files(where, recursive=True, suffix=".parquet")
    have = set(parts)
    older = [rel for rel in result_parts if paths.payload_part(rel) not in have and _has_column(store, rel, PAYLOAD)]
    return _unique_rows(_read_frame(store, parts + older, PAYLOAD_SCHEMA.names))


def _has_column(store: Store, rel: str, name: str) -> bool:
    try:
        with store.fs.open_input_file(store.full(rel)) as f:
            return name in pq.read_schema(f).names
    except (pa.ArrowInvalid, OSError):
        return False  # missing or torn: nothing to read from it


def _read_frame(store: Store, parts: list[str], cols: list[str]) -> pl.DataFrame:
    """``cols`` of every part: one parallel scan, else part by part (a torn part is skipped with a warning)."""
    frame = _scan_parts(store, parts, cols)
    if frame is not None:
        return frame
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
    return frame


def _schema(cols: list[str]) -> pa.Schema:
    return pa.schema([RESULT_SCHEMA.field(c) for c in cols])


def _read_part(store: Store, rel: str, cols: list[str]) -> pa.Table | None:
    """One part; a later column it predates is left out of the read (asking Parquet for it would fail the read,
    and the store would drop the whole part as torn) and filled afterwards."""
    later = [c for c in cols if c in LATER_COLUMNS]
    if not later:
        return store.read_part(rel, cols)
    try:
        with store.fs.open_input_file(store.full(rel)) as f:
            names = set(pq.read_schema(f).names)
    except (pa.ArrowInvalid, OSError):
        return store.read_part(rel, cols)  # missing or torn: the store says so
    return store.read_part(rel, [c for c in cols if c in names or c not in LATER_COLUMNS])


def _fill_later_columns(frame: pl.DataFrame, cols: list[str]) -> pl.DataFrame:
    """Later columns absent from every part read, or null in the rows of older parts: their fill value, in the
    order the caller asked for."""
    fills = []
    for name, value in LATER_COLUMNS.items():
        if name not in cols:
            continue
        if name not in frame.columns:
            fills.append(pl.lit(value, _POLARS_SCHEMA[name]).alias(name))
        elif value is not None and frame[name].null_count():
            fills.append(pl.col(name).fill_null(value))
    if not fills:
        return frame
    return frame.with_columns(fills).select(cols)


def _scan_parts(store: Store, parts: list[str], cols: list[str]) -> pl.DataFrame | None:
    """All parts in one parallel Polars scan (local store); None when that fails or the parts differ. Columns a
    part has beyond ``cols`` are ignored (a result part written before the split holds its payload); parts that
    predate a later column get it as nulls (``_fill_later_columns`` fills them)."""
    if not parts or not store.is_local:
        return None
    expected = pl.Schema({c: _POLARS_SCHEMA[c] for c in cols})
    paths = [str(store.local_path(rel)) for rel in parts]

    def scan(**options) -> pl.DataFrame | None:
        try:
            frame = pl.scan_parquet(paths, schema=expected, extra_columns="ignore", **options).select(cols).collect()
        except Exception:  # noqa: BLE001 - any failure: the part-by-part path skips torn parts with a warning
            return None
        return frame if frame.schema == expected else None

    frame = scan()
    return frame if frame is not None else scan(missing_columns="insert")
