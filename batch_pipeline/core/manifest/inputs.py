"""Read input files (JSONL, CSV, Parquet; local or s3://) as batches of rows plus rejects.

A fast path parses a whole block with Arrow's JSON reader; a block that contains anything odd
(broken JSON, a number where text belongs, invalid UTF-8) is re-read line by line so that every
bad row is named by file, line and field while the good rows around it go on.
"""

import glob
import json
import logging
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import polars as pl
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.fs as pafs
import pyarrow.json as pajson
import pyarrow.parquet as pq

from batch_pipeline.core.errors import InputError
from batch_pipeline.core.manifest.reasons import json_reason, json_type

log = logging.getLogger(__name__)

T = TypeVar("T")
LINE = "_line"
KEY = "_key"
CHUNK_BYTES = 8 * 2**20
RAW_PREVIEW = 200


@dataclass(frozen=True)
class InputFile:
    uri: str  # what users see in rejects and reports
    fs: pafs.FileSystem
    path: str
    format: str
    size: int
    mtime_ns: int | None = None  # with uri and size, the identity an incremental build compares
    # a source that is not a file of rows (another job's table, core/manifest/upstream.py): its batches, given
    # the fields and the key field; the identity above is then what that source says changes with its rows
    reader: Callable[[list[str], str | None], Iterator["RowBatch"]] | None = field(default=None, compare=False)


@dataclass
class ReadExtent:
    """How far a reader got in a file: bytes consumed and the last line number (for the next append)."""

    bytes_read: int = 0
    lines: int = 0
    ends_clean: bool = False  # the part read ends with a newline


@dataclass
class Reject:
    source: str
    line: int
    field: str
    kind: str  # bad_utf8 | bad_json | not_object | missing_field | wrong_type | empty_text | too_long
    reason: str
    raw: str = ""


@dataclass
class RowBatch:
    """Good rows of one block: ``_line``, ``_key`` and every requested field as text."""

    source: str
    frame: pl.DataFrame
    rejects: list[Reject] = field(default_factory=list)


_DONE = object()


def prefetch(items: Iterable[T], depth: int = 2) -> Iterator[T]:
    """``items`` produced on a worker thread, up to ``depth`` ahead: parsing and Polars work release the GIL, so
    the next blocks are read while the caller hashes and deals this one. A worker's error is raised here."""
    q: queue.Queue = queue.Queue(maxsize=max(1, depth))
    stop = threading.Event()

    def work() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(_DONE)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            q.put(_Failed(exc))

    worker = threading.Thread(target=work, name="manifest-read", daemon=True)
    worker.start()
    try:
        while True:
            item = q.get()
            if item is _DONE:
                return
            if isinstance(item, _Failed):
                raise item.exc
            yield item
    finally:
        stop.set()
        worker.join()


class _Failed:
    def __init__(self, exc: BaseException):
        self.exc = exc


def _format_of(path: str, declared: str) -> str:
    if declared != "auto":
        return declared
    lower = path.lower()
    for suffix, fmt in (
        (".jsonl", "jsonl"),
        (".ndjson", "jsonl"),
        (".json", "jsonl"),
        (".csv", "csv"),
        (".parquet", "parquet"),
        (".pq", "parquet"),
    ):
        if lower.endswith(suffix):
            return fmt
    raise InputError(f"{path}: cannot tell the input format from the name; set input.format")


def resolve_inputs(pattern: str, declared_format: str = "auto", base_dir: Path | None = None) -> list[InputFile]:
    """Every file the input path names, sorted, so the same inputs always give the same manifest."""
    if "://" in pattern:
        location, _, query = pattern.partition("?")  # s3://bucket/prefix/*.jsonl?endpoint_override=...
        base = location.split("*")[0].rstrip("/") if "*" in location else location
        fs, path = pafs.FileSystem.from_uri(base + (f"?{query}" if query else ""))
        scheme = pattern.split("://", 1)[0]
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.File:
            infos = [info]
        else:
            infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
            if "*" in location:
                suffix = location.rsplit("*", 1)[1]
                infos = [i for i in infos if i.path.endswith(suffix)]
        files = [
            InputFile(f"{scheme}://{i.path}", fs, i.path, _format_of(i.path, declared_format), i.size, i.mtime_ns)
            for i in infos
            if i.type == pafs.FileType.File and not i.base_name.startswith(".")
        ]
    else:
        p = Path(pattern)
        if not p.is_absolute() and base_dir is not None:
            p = base_dir / p
        if p.is_dir():
            paths = [q for q in p.rglob("*") if q.is_file() and not q.name.startswith(".")]
        else:
            paths = [Path(q) for q in glob.glob(str(p), recursive=True) if Path(q).is_file()]
        local = pafs.LocalFileSystem()
        stats = [(q, q.stat()) for q in paths]
        files = [
            InputFile(str(q), local, str(q.resolve()), _format_of(str(q), declared_format), st.st_size, st.st_mtime_ns)
            for q, st in stats
        ]
    if not files:
        raise InputError(f"input.path {pattern!r} matches no files")
    return sorted(files, key=lambda f: f.uri)


def read_batches(
    f: InputFile,
    fields: list[str],
    key_field: str | None,
    offset: int = 0,
    first_line: int = 1,
    extent: ReadExtent | None = None,
) -> Iterator[RowBatch]:
    """Batches of ``f`` up to its resolved size; JSONL from byte ``offset`` (numbered from ``first_line``).

    ``extent`` is filled in as the file is read (what an incremental build records for the next append).
    """
    extent = extent if extent is not None else ReadExtent()
    if f.reader is not None:
        yield from f.reader(fields, key_field)
        extent.bytes_read, extent.ends_clean = f.size, False
        return
    if f.format == "jsonl":
        yield from _jsonl(f, fields, key_field, offset, first_line, extent)
        return
    if offset:
        raise ValueError(f"{f.uri}: only JSONL is read from an offset")
    reader = {"csv": _csv, "parquet": _parquet}[f.format]
    yield from reader(f, fields, key_field)
    extent.bytes_read, extent.ends_clean = f.size, False


# -- JSONL ---------------------------------------------------------------------------------------
def _jsonl(
    f: InputFile, fields: list[str], key_field: str | None, offset: int, first_line: int, extent: ReadExtent
) -> Iterator[RowBatch]:
    """Reads the bytes ``[offset, f.size)``: a writer appending meanwhile is read by the next generation."""
    wanted = list(dict.fromkeys(fields + ([key_field] if key_field else [])))
    schema = pa.schema([(name, pa.string()) for name in wanted])
    options = pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    next_line = first_line
    carry = b""
    remaining = f.size - offset
    extent.bytes_read, extent.lines, extent.ends_clean = offset, first_line - 1, True
    with f.fs.open_input_file(f.path) as stream:
        if offset:
            stream.seek(offset)
        while True:
            chunk = stream.read(min(CHUNK_BYTES, remaining)) if remaining > 0 else b""
            remaining -= len(chunk)
            data = carry + chunk
            if not chunk:
                if data:
                    yield _jsonl_block(f.uri, data, next_line, fields, key_field, options)
                    extent.bytes_read += len(data)
                    extent.lines, extent.ends_clean = next_line, False
                return
            ends = line_ends(data)  # the newlines, found once per block
            if not len(ends):
                carry = data
                continue
            cut = ends[-1]
            block, carry = data[: cut + 1], data[cut + 1 :]
            yield _jsonl_block(f.uri, block, next_line, fields, key_field, options, ends)
            next_line += len(ends)
            extent.bytes_read += len(block)
            extent.lines = next_line - 1


_STRIP_BYTES = list(b" \t\n\r\x0b\x0c")  # what ``bytes.strip`` removes


def line_ends(block: bytes) -> pl.Series:
    """Offsets of every newline in ``block`` (UInt32), found column-wise over a zero-copy view of its bytes."""
    view = pl.from_arrow(pa.Array.from_buffers(pa.uint8(), len(block), [None, pa.py_buffer(block)]))
    assert isinstance(view, pl.Series)
    return (view == 10).arg_true()


def first_bytes(block: bytes, ends: pl.Series) -> pl.Series:
    """The first byte of every line of ``block`` (``ends``: its newline offsets, the last one at its end)."""
    view = pl.from_arrow(pa.Array.from_buffers(pa.uint8(), len(block), [None, pa.py_buffer(block)]))
    assert isinstance(view, pl.Series)
    starts = pl.concat([pl.Series([0], dtype=ends.dtype), ends.head(len(ends) - 1) + 1])
    return view.gather(starts)


def _clean_line_count(block: bytes, ends: pl.Series | None = None) -> int | None:
    """The number of lines of a block that ends with a newline and has no line that is blank or starts with
    whitespace (so no line needs the per-line filter); None otherwise. ``ends``: the block's newline offsets."""
    if not block.endswith(b"\n"):
        return None
    if ends is None:
        ends = line_ends(block)
    return None if first_bytes(block, ends).is_in(_STRIP_BYTES).any() else len(ends)


def _jsonl_block(
    source: str,
    block: bytes,
    first_line: int,
    fields: list[str],
    key_field: str | None,
    options: pajson.ParseOptions,
    ends: pl.Series | None = None,
) -> RowBatch:
    n = _clean_line_count(block, ends)
    if n:  # every line is a candidate row: parse the block as it is, no split, filter and join
        try:
            table = _read_block(block, options, key_field)
            if table.num_rows != n:
                raise ValueError("row count mismatch")
            table.validate(full=True)  # Arrow's JSON reader does not check UTF-8; this does
        except (pa.ArrowInvalid, UnicodeDecodeError, ValueError):  # the per-line path would fail the same way
            raw_lines = block.split(b"\n")
            raw_lines.pop()
            return _jsonl_slow(source, raw_lines, list(range(first_line, first_line + n)), fields, key_field)
        frame = pl.from_arrow(table)
        assert isinstance(frame, pl.DataFrame)
        frame = frame.with_columns(
            pl.int_range(first_line, first_line + n, dtype=pl.Int64).alias(LINE),
            (pl.col(key_field) if key_field else pl.lit(None, pl.String)).alias(KEY),
        )
        return _split_missing(source, frame, fields, lambda: block.split(b"\n"))
    return _jsonl_lines(source, block, first_line, fields, key_field, options)


def _jsonl_lines(
    source: str, block: bytes, first_line: int, fields: list[str], key_field: str | None, options: pajson.ParseOptions
) -> RowBatch:
    raw_lines = block.split(b"\n")
    if raw_lines and raw_lines[-1] == b"":
        raw_lines.pop()
    line_numbers = [first_line + i for i, line in enumerate(raw_lines) if line.strip()]
    if len(line_numbers) != len(raw_lines):
        raw_lines = [line for line in raw_lines if line.strip()]
    if not raw_lines:
        return RowBatch(source, _empty_frame(fields))
    try:
        table = _read_block(b"\n".join(raw_lines), options, key_field)
        if table.num_rows != len(raw_lines):
            raise ValueError("row count mismatch")
        table.validate(full=True)  # Arrow's JSON reader does not check UTF-8; this does
    except (pa.ArrowInvalid, UnicodeDecodeError, ValueError):
        return _jsonl_slow(source, raw_lines, line_numbers, fields, key_field)
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    frame = frame.with_columns(pl.Series(LINE, line_numbers, dtype=pl.Int64))
    frame = frame.with_columns((pl.col(key_field) if key_field else pl.lit(None, pl.String)).alias(KEY))
    return _split_missing(source, frame, fields, lambda: raw_lines)


def _read_block(data: bytes, options: pajson.ParseOptions, key_field: str | None) -> pa.Table:
    """Parse a block column-wise; a numeric key column (``"id": 123``) is read as a number, kept as text."""
    try:
        return pajson.read_json(pa.BufferReader(data), parse_options=options)
    except pa.ArrowInvalid as exc:
        if not key_field or f"Column(/{key_field}) changed from string" not in str(exc):
            raise
    schema = options.explicit_schema
    numeric = schema.set(schema.get_field_index(key_field), pa.field(key_field, pa.int64()))
    table = pajson.read_json(
        pa.BufferReader(data),
        parse_options=pajson.ParseOptions(explicit_schema=numeric, unexpected_field_behavior="ignore"),
    )
    return table.set_column(
        table.schema.get_field_index(key_field), key_field, table.column(key_field).cast(pa.string())
    )


def _jsonl_slow(
    source: str, raw_lines: list[bytes], line_numbers: list[int], fields: list[str], key_field: str | None
) -> RowBatch:
    rejects: list[Reject] = []
    cols: dict[str, list] = {name: [] for name in fields}
    keys: list[str | None] = []
    lines: list[int] = []
    for raw, line in zip(raw_lines, line_numbers):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            rejects.append(
                Reject(
                    source,
                    line,
                    "",
                    "bad_utf8",
                    f"not valid UTF-8 (byte {exc.start}: {raw[exc.start : exc.start + 1]!r})",
                    raw[:RAW_PREVIEW].decode("utf-8", "replace"),
                )
            )
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as exc:
            rejects.append(Reject(source, line, "", "bad_json", json_reason(exc), text[:RAW_PREVIEW]))
            continue
        if not isinstance(row, dict):
            rejects.append(
                Reject(
                    source, line, "", "not_object", f"expected a JSON object, got {json_type(row)}", text[:RAW_PREVIEW]
                )
            )
            continue
        bad = _bad_field(row, fields)
        if bad:
            rejects.append(Reject(source, line, bad[0], bad[1], bad[2], text[:RAW_PREVIEW]))
            continue
        for name in fields:
            cols[name].append(row[name])
        key = row.get(key_field) if key_field else None
        keys.append(None if key is None else key if isinstance(key, str) else json.dumps(key))
        lines.append(line)
    frame = pl.DataFrame(
        {**cols, LINE: lines, KEY: keys}, schema={**{n: pl.String for n in fields}, LINE: pl.Int64, KEY: pl.String}
    )
    return RowBatch(source, frame, rejects)


def _bad_field(row: dict, fields: list[str]) -> tuple[str, str, str] | None:
    for name in fields:
        value = row.get(name)
        if value is None:  # absent and null are the same reject, whichever reader saw the row
            return name, "missing_field", f"missing or null field '{name}'"
        if not isinstance(value, str):
            return name, "wrong_type", f"field '{name}' must be a string, got {json_type(value)}"
    return None


def _split_missing(
    source: str, frame: pl.DataFrame, fields: list[str], raw_lines: Callable[[], list[bytes]] | None
) -> RowBatch:
    """Rows with a null required field become rejects (Arrow cannot tell missing from null).

    ``raw_lines`` gives the frame's lines (row i is line i), for the reject previews; called only if needed.
    """
    null_any = pl.any_horizontal([pl.col(n).is_null() for n in fields])
    if not frame.select(null_any.any()).item():
        return RowBatch(source, frame.select([*fields, LINE, KEY]))
    lines = raw_lines() if raw_lines else None
    bad = frame.with_row_index("_i").filter(null_any)
    rejects = []
    for row in bad.iter_rows(named=True):
        name = next(n for n in fields if row[n] is None)
        raw = lines[row["_i"]][:RAW_PREVIEW].decode("utf-8", "replace") if lines else ""
        rejects.append(Reject(source, row[LINE], name, "missing_field", f"missing or null field '{name}'", raw))
    return RowBatch(source, frame.filter(~null_any).select([*fields, LINE, KEY]), rejects)


def _empty_frame(fields: list[str]) -> pl.DataFrame:
    return pl.DataFrame(schema={**{n: pl.String for n in fields}, LINE: pl.Int64, KEY: pl.String})


# -- CSV and Parquet -------------------------------------------------------------------------------
def _columnar(
    source: str, batches: Iterator[pa.RecordBatch], fields: list[str], key_field: str | None, first_row: int
) -> Iterator[RowBatch]:
    row = first_row
    for batch in batches:
        names = batch.schema.names
        missing = [n for n in fields if n not in names]
        if missing:
            raise InputError(f"{source}: has no column(s) {missing}; columns are {names}")
        frame = pl.from_arrow(pa.Table.from_batches([batch]))
        assert isinstance(frame, pl.DataFrame)
        frame = frame.with_columns(
            *[pl.col(n).cast(pl.String) for n in fields],
            pl.int_range(row, row + batch.num_rows, dtype=pl.Int64).alias(LINE),
            (pl.col(key_field).cast(pl.String) if key_field and key_field in names else pl.lit(None, pl.String)).alias(
                KEY
            ),
        )
        row += batch.num_rows
        yield _split_missing(source, frame, fields, None)


def _csv(f: InputFile, fields: list[str], key_field: str | None) -> Iterator[RowBatch]:
    wanted = fields + ([key_field] if key_field else [])
    convert = pacsv.ConvertOptions(column_types={n: pa.string() for n in wanted}, strings_can_be_null=False)
    with f.fs.open_input_stream(f.path) as stream:
        reader = pacsv.open_csv(stream, convert_options=convert, read_options=pacsv.ReadOptions(block_size=CHUNK_BYTES))
        yield from _columnar(f.uri, iter(reader), fields, key_field, first_row=2)  # line 1 is the header


def _parquet(f: InputFile, fields: list[str], key_field: str | None) -> Iterator[RowBatch]:
    with f.fs.open_input_file(f.path) as handle:
        pf = pq.ParquetFile(handle)
        cols = [c for c in dict.fromkeys(fields + ([key_field] if key_field else [])) if c in pf.schema_arrow.names]
        yield from _columnar(f.uri, pf.iter_batches(batch_size=65536, columns=cols), fields, key_field, first_row=1)
