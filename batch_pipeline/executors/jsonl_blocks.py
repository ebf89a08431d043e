"""Provider result files (JSON lines) read column-wise, one block at a time; shared by the provider formats.

A download arrives as byte chunks; ``iter_blocks`` re-cuts them into blocks that end at line boundaries,
``lines_array`` makes a block's lines one Arrow string array, ``extract`` runs a DuckDB query over them (its
JSON functions parse each line once, with yyjson), and ``parse_stream`` parses blocks on worker threads in file
order. A block the column path refuses (blank lines, bytes that are not UTF-8, malformed JSON) goes to the
format's per-line path, which uses ``read_lines``.
"""

import threading
from collections.abc import Callable, Iterable, Iterator

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from batch_pipeline.core.run.threads import ordered_map

# Result files are parsed, validated and written one block of about this size at a time (one result part per
# block). Each block pays fixed costs (a DuckDB query, a Parquet file): 16 MB blocks ingested 5-10% faster than
# 8 MB and 2-3x faster than 0.5-2 MB; memory holds about (parse workers + 3) blocks.
RESULT_BLOCK_BYTES = 16 * 2**20
# A file of known size is cut for the parse workers only into blocks of at least this size: each block pays a DuckDB
# query's fixed cost (~2.5 ms CPU), and a 5,000-line shard's ~4.25 MB cut in two cost 6-25% more CPU per line in the
# runner, which collects several shards at once (``collect_shards_at_once``) and so keeps both cores busy without it.
MIN_BLOCK_BYTES = 4 * 2**20
_SPACE = np.zeros(256, bool)  # what ``bytes.strip`` removes, as a lookup table by byte value
_SPACE[list(b" \t\r\x0b\x0c\n")] = True
_STRING = pa.string()
_duckdb = threading.local()


def iter_blocks(chunks: Iterable[bytes], block_bytes: int = RESULT_BLOCK_BYTES) -> Iterator[bytes]:
    """Re-cut a byte stream into blocks that end at line boundaries.

    Chunks are kept in a list and each block is joined once, cut at the last newline of its last chunk (appending
    to one growing ``bytes`` copied it again for every chunk, and slicing the joined block copied it twice)."""
    parts: list[bytes] = []
    size = 0
    for chunk in chunks:
        if not chunk:
            continue
        parts.append(chunk)
        size += len(chunk)
        if size < block_bytes:
            continue
        for i in range(len(parts) - 1, -1, -1):  # the last chunk that holds a newline, normally the last one
            cut = parts[i].rfind(b"\n")
            if cut >= 0:
                break
        else:
            continue
        head, tail = parts[i][: cut + 1], parts[i][cut + 1 :]
        rest = parts[i + 1 :]
        yield b"".join([*parts[:i], head]) if i else head
        parts = [tail, *rest] if tail else rest
        size = sum(map(len, parts))
    data = b"".join(parts)
    if data and not data.isspace():  # not ``data.strip()``: that copies the block to drop its last newline
        yield data


def block_bytes_for(total_bytes: int | None, workers: int, cap: int = RESULT_BLOCK_BYTES) -> int:
    """How big a block to cut: ``cap``, but a file of known size is cut into one block per parse worker (a 42 MB
    50,000-line file in 16 MB blocks left a core idle at its end) when every block gets ``MIN_BLOCK_BYTES`` or
    more; a smaller file is parsed whole (one query's fixed cost, not one per worker)."""
    if not total_bytes or workers <= 1 or total_bytes < workers * MIN_BLOCK_BYTES:
        return cap
    return min(cap, -(-total_bytes // workers))


def parse_stream(
    parse_block: Callable[[bytes], pa.Table],
    chunks: Iterable[bytes],
    workers: int = 1,
    block_bytes: int = RESULT_BLOCK_BYTES,
    total_bytes: int | None = None,
) -> Iterator[pa.Table]:
    """A downloaded result file, as byte chunks -> one table per block of about ``block_bytes``, in file order;
    blocks are parsed on ``workers`` threads while the next ones arrive. A file whose ``total_bytes`` is known is
    parsed in smaller blocks, one per worker at least (``block_bytes_for``), and their tables are joined again up
    to ``block_bytes`` (``join_tables``): the cut is for the parse, and each table is a flush the runner stores as
    a pair of parts, each paying a Parquet file's fixed costs."""
    size = block_bytes_for(total_bytes, workers, block_bytes)
    tables = ordered_map(parse_block, iter_blocks(chunks, size), workers)
    return tables if size >= block_bytes else join_tables(tables, block_bytes)


def join_tables(tables: Iterable[pa.Table], limit: int) -> Iterator[pa.Table]:
    """Consecutive tables of one schema joined while together within ``limit`` bytes (no copy: the joined
    table's columns are the tables' chunks), in order. A group of half the limit or more goes at once rather
    than waiting for the next table (nothing as large could join it)."""
    held: list[pa.Table] = []
    size = 0
    for table in tables:
        if held and (size + table.nbytes > limit or not table.schema.equals(held[0].schema)):
            yield _joined(held)
            held, size = [], 0
        held.append(table)
        size += table.nbytes
        if size >= limit // 2:
            yield _joined(held)
            held, size = [], 0
    if held:
        yield _joined(held)


def _joined(tables: list[pa.Table]) -> pa.Table:
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables)


def lines_array(block: bytes) -> pa.StringArray | None:
    """The block's lines (without their newline) as one Arrow string array over one copy of the block's bytes
    (offsets found with numpy); None when the block has a blank line or one that starts with whitespace (the
    per-line path handles those).

    UTF-8 is not checked here: DuckDB checks every string it scans and raises on a bad one, which sends the block
    to the per-line path (checking here too cost 0.4 s per 1M lines)."""
    if not block.endswith(b"\n"):
        block += b"\n"
    if len(block) >= 2**31:
        return None
    data = np.frombuffer(block, np.uint8)
    ends = np.flatnonzero(data == 10).astype(np.int32)
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    if _SPACE[data[starts]].any():  # a blank line, or one that starts with whitespace
        return None
    offsets = np.empty(len(ends) + 1, np.int32)
    offsets[0] = 0
    offsets[1:] = ends - np.arange(len(ends), dtype=np.int32)  # each line's end once its newlines are gone
    return pa.StringArray.from_buffers(len(ends), pa.py_buffer(offsets), pa.py_buffer(block.replace(b"\n", b"")))


def json_paths_sql(paths: list[str]) -> str:
    """``json_extract_string(line, [paths])``: one parse per line, a list of strings (objects as JSON text)."""
    return "json_extract_string(line, [" + ", ".join(f"'{p}'" for p in paths) + "])"


def extract(lines: pa.StringArray, sql: str) -> pa.Table | None:
    """Run ``sql`` over the table ``lines(line)`` on this thread's DuckDB connection; None when DuckDB refuses
    the block (malformed JSON, bytes that are not UTF-8) or returns another number of rows."""
    con = getattr(_duckdb, "con", None)
    if con is None:
        # one thread: a block is one Arrow batch, which DuckDB scans on one thread anyway; other blocks are
        # parsed on the other workers
        con = _duckdb.con = duckdb.connect(config={"threads": 1})
        _duckdb.relations = {}
    relations: dict[str, duckdb.DuckDBPyRelation] = _duckdb.relations
    con.register("lines", pa.table({"line": lines}))
    try:
        # a query's relation is made once per thread and run again over each newly registered block: it binds
        # to the block by name, and making it (parse and bind) cost ~0.8 ms of a 5,000-line block's ~12
        relation = relations.get(sql)
        if relation is None:
            relation = relations[sql] = con.sql(sql)
        t = relation.to_arrow_table()
    except (duckdb.Error, UnicodeDecodeError):
        return None
    finally:
        con.unregister("lines")
    return t if t.num_rows == len(lines) else None


def extract_block(block: bytes, sql: str) -> tuple[pa.StringArray, pa.Table] | None:
    """(the block's lines, ``sql`` over them), or None when the column path refuses the block."""
    lines = lines_array(block)
    if lines is None:
        return None
    t = extract(lines, sql)
    return None if t is None else (lines, t)


def parse_columnwise(
    block: bytes,
    sql: str,
    assemble: Callable[[pa.Table, pa.StringArray], pa.Table],
    parse_lines: Callable[[bytes], pa.Table],
) -> pa.Table | None:
    """A block's rows read column-wise: ``sql`` over its lines, ``assemble``d (extracted columns, lines) into the
    format's rows, and the rows its ``_odd`` column marks (or leaves null) parsed again by the format's per-line
    ``parse_lines``, in their place. None when the column path refuses the block, for ``parse_lines`` to take
    it whole."""
    read = extract_block(block, sql)
    if read is None:
        return None
    lines, extracted = read
    table = assemble(extracted, lines)
    odd = pc.fill_null(extracted.column("_odd"), True)
    if not pc.any(odd).as_py():
        return table
    return replace_rows(table, odd, parse_lines(b"\n".join(s.as_py().encode() for s in lines.filter(odd))))


def replace_rows(table: pa.Table, mask: pa.Array | pa.ChunkedArray, replacement: pa.Table) -> pa.Table:
    """``table`` with the rows where ``mask`` is true replaced, in order, by the rows of ``replacement``."""
    odd = pc.indices_nonzero(mask)
    regular = pc.indices_nonzero(pc.invert(mask))
    merged = pa.concat_tables([table.take(regular), replacement.select(table.column_names).cast(table.schema)])
    return merged.take(pc.sort_indices(pa.concat_arrays([regular, odd])))


def lookup(
    values: pa.Array | pa.ChunkedArray, mapping: dict, value_type: pa.DataType, key_type: pa.DataType = _STRING
) -> pa.Array:
    """``mapping[value]`` element-wise; null where the value is null or not a key."""
    keys = list(mapping)
    index = pc.index_in(values, value_set=pa.array(keys, key_type))
    return pc.take(pa.array([mapping[k] for k in keys], value_type), index)


def one_chunk(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A column as one array (``Table.from_arrays`` takes arrays of one kind)."""
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def utf8_or_marker(lines: list[bytes], marker: bytes) -> list[bytes]:
    """Each line, or ``marker`` where it is not valid UTF-8: Arrow's JSON reader passes such bytes into its
    string columns, where they would break every later reader."""
    try:
        for line in lines:
            line.decode("utf-8")  # ASCII-fast in CPython; the common case ends here
        return lines
    except UnicodeDecodeError:
        pass
    out = []
    for line in lines:
        try:
            line.decode("utf-8")
        except UnicodeDecodeError:
            line = marker
        out.append(line)
    return out


def read_lines(lines: list[bytes], schema: pa.Schema, loose: Callable[[bytes], dict]) -> pa.Table:
    """Provider result lines as a table of ``schema``: Arrow's reader for the block, ``loose`` line by line
    when it refuses (a line of another shape must not sink its neighbours)."""
    options = pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    try:
        t = pajson.read_json(pa.BufferReader(b"\n".join(lines)), parse_options=options)
        if t.num_rows != len(lines):
            raise ValueError("row count mismatch")
        return t
    except (pa.ArrowInvalid, ValueError):
        return pa.Table.from_pylist([loose(line) for line in lines], schema=schema)
