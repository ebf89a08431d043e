"""Append-only results: one row per outcome of one request in one attempt.

Rows are written as Parquet parts per (shard, attempt, flush) and never changed. A re-collected
attempt (after a crash mid-collection) may write the same rows again; readers keep one row per
(request_id, attempt), so a repeat changes nothing.
"""

import uuid
from datetime import UTC, datetime

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from batch_pipeline.core.cost import Price
from batch_pipeline.core.executor import RAW_RESULT_SCHEMA, ShardWork
from batch_pipeline.core.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline.core.validate import validate

TS = pa.timestamp("us", tz="UTC")
RESULT_SCHEMA = pa.schema([
    ("request_id", pa.string()), ("shard_id", pa.string()), ("attempt", pa.int32()),
    ("backend", pa.string()), ("pricing", pa.string()), ("model", pa.string()), ("prompt_version", pa.string()),
    ("status", pa.string()), ("output_text", pa.string()), ("parsed_output", pa.string()),
    ("finish_reason", pa.string()), ("input_tokens", pa.int64()), ("cached_tokens", pa.int64()),
    ("output_tokens", pa.int64()), ("cost_usd", pa.float64()),
    ("error_class", pa.string()), ("error_code", pa.string()), ("error_message", pa.string()),
    ("provider_batch_id", pa.string()), ("provider_request_id", pa.string()), ("raw_payload", pa.string()),
    ("recorded_at", TS),
])


def build_results(raw: pa.Table, work: ShardWork, *, backend: str, pricing: str, prompt_version: str,
                  price: Price | None, provider_batch_id: str | None) -> pa.Table:
    """Validate raw provider rows and stamp them with their attempt, cost and provenance."""
    raw = raw.select(RAW_RESULT_SCHEMA.names).cast(RAW_RESULT_SCHEMA)
    verdicts = validate(raw, work.plan.output)
    n = raw.num_rows
    zeros = pa.array([0] * n, pa.int64())
    in_tok = pc.fill_null(raw.column("input_tokens"), 0)
    cached = pc.fill_null(raw.column("cached_tokens"), 0)
    out_tok = pc.fill_null(raw.column("output_tokens"), 0)
    if price is not None and n:
        cached_rate = price.cached_input_per_mtok if price.cached_input_per_mtok is not None else price.input_per_mtok
        discount = 1 - price.batch_discount if pricing == "batch" else 1.0
        cost = pc.multiply(pc.divide(pc.add(pc.add(
            pc.multiply(pc.cast(pc.subtract(in_tok, cached), pa.float64()), price.input_per_mtok),
            pc.multiply(pc.cast(cached, pa.float64()), cached_rate)),
            pc.multiply(pc.cast(out_tok, pa.float64()), price.output_per_mtok)), 1e6), discount)
    else:
        cost = pa.array([0.0] * n, pa.float64())
    now = datetime.now(UTC)

    def const(value, typ=pa.string()):
        return pa.array([value] * n, typ)

    return pa.Table.from_arrays([
        raw.column("request_id"), const(work.shard_id), const(work.attempt, pa.int32()),
        const(backend), const(pricing), const(work.plan.model), const(prompt_version),
        verdicts.status, raw.column("output_text"), verdicts.parsed_output, raw.column("finish_reason"),
        in_tok if n else zeros, cached if n else zeros, out_tok if n else zeros, cost,
        verdicts.error_class, pc.coalesce(verdicts.error_code, raw.column("error_code")) if n else verdicts.error_code,
        verdicts.error_message, const(provider_batch_id), raw.column("provider_request_id"), raw.column("raw_payload"),
        const(now, TS),
    ], schema=RESULT_SCHEMA)


def write_results(store: Store, job: str, shard_id: str, attempt: int, flush: int, table: pa.Table) -> str:
    rel = JobPaths(job).result_part(shard_id, attempt, flush, uuid.uuid4().hex[:8])
    store.write_table(rel, table)
    return rel


def read_results(store: Store, job: str, shard_id: str | None = None, columns: list[str] | None = None) -> pl.DataFrame:
    """Every stored result row, one per (request_id, attempt)."""
    paths = JobPaths(job)
    where = f"{paths.results}/{shard_id}" if shard_id else paths.results
    cols = columns if columns is None or {"request_id", "attempt"} <= set(columns) else \
        list(dict.fromkeys(["request_id", "attempt", *columns]))
    tables = []
    for rel in store.list_files(where, recursive=True, suffix=".parquet"):
        t = store.read_part(rel, cols)
        if t is not None and t.num_rows:
            tables.append(t)
    if not tables:
        schema = RESULT_SCHEMA if cols is None else pa.schema([RESULT_SCHEMA.field(c) for c in cols])
        frame = pl.from_arrow(schema.empty_table())
    else:
        frame = pl.from_arrow(pa.concat_tables(tables, promote_options="permissive"))
    assert isinstance(frame, pl.DataFrame)
    return frame.unique(subset=["request_id", "attempt"], keep="first", maintain_order=True)
