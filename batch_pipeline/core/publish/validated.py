"""The validated table, built by DuckDB over the Parquet files themselves: one row per source row, the latest valid
result of its request.

DuckDB scans the result parts and the manifest's rows parts (its own Parquet reader on local disk, Arrow datasets
over the store's filesystem on S3), keeps each request's latest succeeded result, joins the source rows to it and sorts them by source and
line, under a memory limit: past it, the join and the sort spill to a temporary directory. The table streams out
in record batches into the staged file, so neither the results nor the table are ever whole in memory.

Duplicates are paid once and answered for every row: the first row of a request (in source, line order) carries
its cost, the others ``cost_usd`` 0 and ``is_duplicate``; summing the table's cost gives what accepted items cost.
"""

import ctypes
import gc
import logging
import tempfile
from concurrent.futures import ThreadPoolExecutor

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from batch_pipeline.core.ledger.result_parts import PART_SCHEMA, result_parts
from batch_pipeline.core.manifest.read import ANSWER_COLUMNS, ROW_SCHEMA, VALIDATED_SCHEMA
from batch_pipeline.core.manifest.shards import Manifest
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store

log = logging.getLogger(__name__)

# DuckDB's own buffers; the join and the sort spill past them. A 10M-item table: 768 MB -> 1.42 GB peak in 70.8 s,
# 1 GB -> 1.65 GB in 56.8 s, 512 MB runs out ("failed to pin block"): the fallback covers a larger job's needs
MEMORY_LIMIT = "768MB"
FALLBACK_MEMORY_LIMIT = "2GB"
BATCH_ROWS = 100_000
# DuckDB's zstd level for the table it writes (its default is 3): at 1M rows level 1 took 0.3 CPU s (7%) less of the
# query and wrote a file 4% smaller (38.8 against 40.5 MB), medians of 6 alternated runs
ZSTD_LEVEL = 1
# what the query reads of the result parts: the request, its shard and status, its parsed output, what it carries
_RESULT_COLUMNS = ["request_id", "shard_id", "status", "parsed_output", *ANSWER_COLUMNS, "provider_batch_id"]
EMBEDDING = "embedding"


def validated_schema(spec: JobSpec) -> pa.Schema:
    """``VALIDATED_SCHEMA``, and for an embeddings job the vector as a fixed-size float32 list (DuckDB's FLOAT[N])."""
    if spec.output.embedding is None:
        return VALIDATED_SCHEMA
    return VALIDATED_SCHEMA.append(pa.field(EMBEDDING, pa.list_(pa.float32(), spec.output.embedding.dimensions)))


_QUERY = """
WITH valid AS (
    SELECT * FROM results WHERE status = 'succeeded'
    QUALIFY row_number() OVER (PARTITION BY request_id ORDER BY attempt DESC) = 1
), source_rows AS (
    SELECT *, row_number() OVER (PARTITION BY request_id ORDER BY source, line) > 1 AS is_duplicate
    FROM ({rows}) AS r
)
SELECT r.source, r.line, r.source_key, r.request_id, v.shard_id, v.parsed_output AS output, v.output_text,
       v.finish_reason, v.model, v.prompt_version, v.backend, v.pricing, v.attempt, v.input_tokens, v.cached_tokens,
       v.output_tokens, CASE WHEN r.is_duplicate THEN 0.0 ELSE v.cost_usd END AS cost_usd, r.is_duplicate,
       v.provider_batch_id{extra}
FROM source_rows AS r JOIN valid AS v ON r.request_id = v.request_id
ORDER BY r.source, r.line
"""


# Below this many bytes of results the query's own memory is small, and a full garbage collection (0.1-0.5 s in a
# process holding many Dagster definitions, as a test run or `dagster dev`'s) costs more than it would hand back.
COLLECT_FROM_BYTES = 16 * 2**20


def return_freed_memory(collect: bool = True) -> None:
    """Hand what earlier steps freed back to the OS before the query that peaks the run (``e2e_bench`` at 1M: the
    process stood at ~600 MiB of mostly freed heap and Arrow pool when this query added ~800): Python's garbage
    (``collect``), Arrow's pool (``release_unused``) and glibc's heap (``malloc_trim``, where libc has it). On
    jemalloc (``core/arrow_pool.py``) ``release_unused`` changes nothing: its background threads hand freed pages
    back within its 1 s decay on their own."""
    if collect:
        gc.collect()
    pa.default_memory_pool().release_unused()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def write_validated(
    spec: JobSpec,
    store: Store,
    rel: str,
    memory_limit: str = MEMORY_LIMIT,
    collect_from_bytes: int = COLLECT_FROM_BYTES,
) -> int:
    """Build the validated table into ``rel`` (replaced atomically); the number of rows written. Should DuckDB
    run out of ``memory_limit`` (an operator that cannot spill), it is built again with ``FALLBACK_MEMORY_LIMIT``.
    Python's garbage is collected first when the job's results reach ``collect_from_bytes``."""
    results_bytes = sum(size for _, size, _ in store.file_stats(JobPaths(spec.name).results))
    return_freed_memory(collect=results_bytes >= collect_from_bytes)
    try:
        return _write_validated(spec, store, rel, memory_limit)
    except duckdb.OutOfMemoryException as exc:
        log.warning("validated table: out of DuckDB's %s (%s); again with %s", memory_limit, exc, FALLBACK_MEMORY_LIMIT)
        return _write_validated(spec, store, rel, FALLBACK_MEMORY_LIMIT)


def _write_validated(spec: JobSpec, store: Store, rel: str, memory_limit: str) -> int:
    manifest = Manifest(spec.name, store)
    parts = [p for ps in result_parts(store, spec.name).values() for p in ps]
    rows = [(manifest.paths.rows(gen), sources) for gen, sources in sorted(manifest.live_parts().items())]
    rows = [(p, s) for p, s in rows if store.exists(p)]
    schema = validated_schema(spec)
    try:
        return _write(store, rel, parts, rows, memory_limit, schema)
    except duckdb.OutOfMemoryException:
        raise
    except (duckdb.Error, pa.ArrowInvalid, OSError):  # parts of differing schemas (older ones): match by name
        pass
    try:
        return _write(store, rel, parts, rows, memory_limit, schema, by_name=True)
    except duckdb.OutOfMemoryException:
        raise
    except (duckdb.Error, pa.ArrowInvalid, OSError) as exc:  # a torn part: leave out what does not open, again
        readable = _readable(store, parts)
        if len(readable) == len(parts):
            raise
        log.warning("validated table: %d torn result part(s) left out (%s)", len(parts) - len(readable), exc)
        return _write(store, rel, readable, rows, memory_limit, schema, by_name=True)


def _write(
    store: Store,
    rel: str,
    parts: list[str],
    rows: list[tuple[str, list[str]]],
    memory_limit: str,
    schema: pa.Schema = VALIDATED_SCHEMA,
    by_name: bool = False,
) -> int:
    """One DuckDB query into ``rel``. The explicit ORDER BY orders the output, so insertion order is not kept
    (keeping it held more in memory). On local disk DuckDB writes the file itself (``COPY``: 6.6 s against 15 s
    through Arrow batches for 1M rows); an embeddings table (its FLOAT[N] column written as Arrow's fixed-size
    list) and S3 stream Arrow batches into ``Store.parquet_writer``."""
    with tempfile.TemporaryDirectory(prefix="batch-pipeline-publish-") as spill:
        con = duckdb.connect(
            config={"memory_limit": memory_limit, "temp_directory": spill, "preserve_insertion_order": False}
        )
        try:
            vector = schema.field(EMBEDDING) if EMBEDDING in schema.names else None
            columns = [*_RESULT_COLUMNS, *([EMBEDDING] if vector else [])]
            results = _source(con, store, "results_parts", parts, [PART_SCHEMA.field(c) for c in columns], by_name)
            con.execute(f"CREATE TEMP VIEW results AS SELECT {', '.join(columns)} FROM {results}")
            selects = []
            for i, (path, sources) in enumerate(rows):
                where = ""
                if sources:
                    con.register(f"sources_{i}", pa.table({"source": pa.array(sources, pa.string())}))
                    where = f" WHERE source IN (SELECT source FROM sources_{i})"
                selects.append(
                    f"SELECT source, line, source_key, request_id FROM "
                    f"{_source(con, store, f'rows_{i}', [path], list(ROW_SCHEMA))}{where}"
                )
            if not selects:
                selects = [f"SELECT * FROM {_source(con, store, 'no_rows', [], list(ROW_SCHEMA))}"]
            extra = f", v.{EMBEDDING}::FLOAT[{vector.type.list_size}] AS {EMBEDDING}" if vector else ""
            query = _QUERY.format(rows=" UNION ALL ".join(selects), extra=extra)
            if store.is_local and vector is None:
                with store.local_target(rel) as target:
                    (n,) = con.execute(
                        f"COPY ({query}) TO '{_quoted(str(target))}' "
                        f"(FORMAT parquet, COMPRESSION zstd, COMPRESSION_LEVEL {ZSTD_LEVEL})"
                    ).fetchone() or (0,)
                return int(n)
            reader = con.sql(query).to_arrow_reader(BATCH_ROWS)
            n = 0
            with store.parquet_writer(rel, schema) as writer:
                for batch in reader:
                    writer.write_batch(batch.cast(schema) if batch.schema != schema else batch)
                    n += batch.num_rows
            return n
        finally:
            con.close()


def _quoted(text: str) -> str:
    return text.replace("'", "''")


def _source(
    con: duckdb.DuckDBPyConnection,
    store: Store,
    name: str,
    rels: list[str],
    fields: list[pa.Field],
    by_name: bool = False,
) -> str:
    """What the query reads ``rels`` as. On local disk DuckDB's own Parquet reader (measured: 5.2 against 7.5 CPU s
    for 1M results in 3,000 parts read as an Arrow dataset); columns are matched by name, and a part without a
    column read (one written before it existed) fails the read unless ``by_name`` unifies every part's schema first
    (which holds every part's metadata: +1.5 GB RSS for the 30,000 parts of a 10M-item job, so only as the second
    try). Elsewhere (S3) an Arrow dataset of ``fields`` over the store's filesystem (a missing column reads as
    null)."""
    if not rels:
        con.register(name, pa.Table.from_batches([], pa.schema(fields)))
        return name
    if store.is_local:
        listed = ", ".join("'" + _quoted(str(store.local_path(r))) + "'" for r in rels)
        return f"read_parquet([{listed}]{', union_by_name = true' if by_name else ''})"
    con.register(name, store.dataset(rels, pa.schema(fields)))
    return name


def _readable(store: Store, parts: list[str]) -> list[str]:
    def ok(rel: str) -> bool:
        try:
            with store.fs.open_input_file(store.full(rel)) as f:
                pq.read_metadata(f)
            return True
        except (pa.ArrowInvalid, OSError):
            return False

    with ThreadPoolExecutor(max_workers=1 if store.is_local else 16) as pool:
        return [rel for rel, good in zip(parts, pool.map(ok, parts)) if good]
