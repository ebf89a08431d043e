"""Read input files (JSONL, CSV, Parquet; local or s3://; JSONL and CSV also compressed whole: .gz, .zst, .bz2)
as batches of rows plus rejects.

A fast path parses a whole block with Arrow's JSON reader; a block that contains anything odd
(broken JSON, a number where text belongs, invalid UTF-8) is re-read line by line so that every
bad row is named by file, line and field while the good rows around it go on.
"""

import glob
import logging
import queue
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TypeVar

import polars as pl
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from batch_pipeline.core.errors import InputError
from batch_pipeline.core.manifest.jsonl import read_jsonl
from batch_pipeline.core.manifest.rows import (
    CHUNK_BYTES,
    KEY,
    LINE,
    InputFile,
    ReadExtent,
    RowBatch,
    compression_of,
    decompression_error,
    split_missing,
    without_compression_suffix,
)

log = logging.getLogger(__name__)

T = TypeVar("T")


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
    """The format a file is read as: as declared, else from its name (``rows.jsonl.zst`` is compressed JSONL)."""
    named = without_compression_suffix(path).lower()
    if compression_of(path) is not None and (declared == "parquet" or named.endswith(PARQUET_SUFFIXES)):
        raise InputError(
            f"{path}: a Parquet file is compressed inside (its column codec); pass it without an outer "
            f"{path[path.rfind('.') :]} compression"
        )
    if declared != "auto":
        return declared
    for suffix, fmt in (
        (".jsonl", "jsonl"),
        (".ndjson", "jsonl"),
        (".json", "jsonl"),
        (".csv", "csv"),
        *((suffix, "parquet") for suffix in PARQUET_SUFFIXES),
    ):
        if named.endswith(suffix):
            return fmt
    raise InputError(f"{path}: cannot tell the input format from the name; set input.format")


PARQUET_SUFFIXES = (".parquet", ".pq")


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
        yield from read_jsonl(f, fields, key_field, offset, first_line, extent)
        return
    if offset:
        raise ValueError(f"{f.uri}: only JSONL is read from an offset")
    reader = {"csv": _csv, "parquet": _parquet}[f.format]
    yield from reader(f, fields, key_field)
    extent.bytes_read, extent.ends_clean = f.size, False


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
        yield split_missing(source, frame, fields, None)


def _csv(f: InputFile, fields: list[str], key_field: str | None) -> Iterator[RowBatch]:
    wanted = fields + ([key_field] if key_field else [])
    convert = pacsv.ConvertOptions(column_types={n: pa.string() for n in wanted}, strings_can_be_null=False)
    with f.open_text() as stream:
        try:
            reader = pacsv.open_csv(
                stream, convert_options=convert, read_options=pacsv.ReadOptions(block_size=CHUNK_BYTES)
            )
            yield from _columnar(f.uri, iter(reader), fields, key_field, first_row=2)  # line 1 is the header
        except OSError as exc:  # a torn or corrupt archive (a plain file's read errors are not input errors)
            if f.compression is None:
                raise
            raise decompression_error(f, exc) from exc


def _parquet(f: InputFile, fields: list[str], key_field: str | None) -> Iterator[RowBatch]:
    with f.fs.open_input_file(f.path) as handle:
        pf = pq.ParquetFile(handle)
        cols = [c for c in dict.fromkeys(fields + ([key_field] if key_field else [])) if c in pf.schema_arrow.names]
        yield from _columnar(f.uri, pf.iter_batches(batch_size=65536, columns=cols), fields, key_field, first_row=1)
