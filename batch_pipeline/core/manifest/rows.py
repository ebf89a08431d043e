"""The rows an input reader yields and the checks every reader shares: a batch of good rows with the rejects
found beside it, each reject named by source, line and field."""

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import polars as pl
import pyarrow as pa
import pyarrow.fs as pafs

from batch_pipeline.core.errors import InputError
from batch_pipeline.core.manifest.reasons import json_reason, json_type

LINE = "_line"
KEY = "_key"
CHUNK_BYTES = 8 * 2**20
RAW_PREVIEW = 200
# a file of lines may be compressed as a whole; the name says how (what ``data.jsonl.zst`` is read with)
COMPRESSION_SUFFIXES = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd", ".bz2": "bz2"}


def compression_of(path: str) -> str | None:
    """The codec a file's name ends with (``.gz``, ``.zst``, ``.bz2``), or None for a plain file."""
    lower = path.lower()
    return next((codec for suffix, codec in COMPRESSION_SUFFIXES.items() if lower.endswith(suffix)), None)


def without_compression_suffix(path: str) -> str:
    """``rows.jsonl.zst`` -> ``rows.jsonl``: the name that says the format."""
    codec = compression_of(path)
    return path[: path.rfind(".")] if codec else path


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

    @property
    def compression(self) -> str | None:
        """How the whole file is compressed (from its name), or None. A compressed file is read from its start
        only: an incremental build reads it again when it changes (no appends from an offset)."""
        return None if self.reader is not None else compression_of(self.path)

    def open_text(self) -> pa.NativeFile:
        """The file's (decompressed) bytes as a stream, from the start."""
        raw = self.fs.open_input_file(self.path)
        return pa.CompressedInputStream(raw, self.compression) if self.compression else raw


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


def bad_field(row: dict, fields: list[str]) -> tuple[str, str, str] | None:
    for name in fields:
        value = row.get(name)
        if value is None:  # absent and null are the same reject, whichever reader saw the row
            return name, "missing_field", f"missing or null field '{name}'"
        if not isinstance(value, str):
            return name, "wrong_type", f"field '{name}' must be a string, got {json_type(value)}"
    return None


def split_missing(
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


def empty_frame(fields: list[str]) -> pl.DataFrame:
    return pl.DataFrame(schema={**{n: pl.String for n in fields}, LINE: pl.Int64, KEY: pl.String})


def line_blocks(f: InputFile, offset: int, first_line: int, extent: ReadExtent) -> Iterator[tuple[int, bytes]]:
    """The bytes ``[offset, f.size)`` of a file of lines as blocks of whole lines, each with its first line's
    number: every block ends with a newline but a last line without one, handed out alone. A writer appending
    meanwhile is read by the next generation. ``extent`` reaches to the end of the blocks taken so far (it moves
    when the next is asked for, so a block the caller has not finished with is not counted).

    A compressed file is read whole, from its start; its ``extent`` counts compressed bytes (what the progress
    bar measures against ``f.size``) and never ends clean, so a changed file is read again, not appended."""
    compressed = f.compression is not None
    if compressed and offset:
        raise ValueError(f"{f.uri}: a compressed file is read from its start, not from byte {offset}")
    line = first_line
    carry = b""
    extent.bytes_read, extent.lines, extent.ends_clean = offset, first_line - 1, not compressed
    for chunk, position in file_chunks(f, offset):
        data = carry + chunk
        cut = data.rfind(b"\n")
        if cut < 0:
            carry = data
            continue
        block, carry = data[: cut + 1], data[cut + 1 :]
        yield line, block
        line += block.count(b"\n")
        # a plain file's extent ends exactly after the last whole line (an append starts there)
        extent.bytes_read = position if compressed else extent.bytes_read + len(block)
        extent.lines = line - 1
    if carry:
        yield line, carry
        extent.bytes_read += len(carry)
        extent.lines, extent.ends_clean = line, False
    if compressed:
        extent.bytes_read = f.size


def file_chunks(f: InputFile, offset: int = 0) -> Iterator[tuple[bytes, int]]:
    """The file's text from ``offset`` (plain files) up to its listed size, in chunks, each with how far into the
    file on disk the read has got. A compressed file is decompressed as it is read; a torn or corrupt archive is an
    ``InputError`` that names the file and where it broke."""
    if f.compression is None:
        remaining = f.size - offset
        with f.fs.open_input_file(f.path) as stream:
            if offset:
                stream.seek(offset)
            while remaining > 0 and (chunk := stream.read(min(CHUNK_BYTES, remaining))):
                remaining -= len(chunk)
                yield chunk, f.size - remaining
        return
    with f.fs.open_input_file(f.path) as raw, pa.CompressedInputStream(raw, f.compression) as stream:
        while True:
            try:
                chunk = stream.read(CHUNK_BYTES)
            except (OSError, pa.ArrowInvalid) as exc:
                raise decompression_error(f, exc, f" past byte {raw.tell():,} of {f.size:,}") from exc
            if not chunk:
                return
            yield chunk, min(raw.tell(), f.size)


def decompression_error(f: InputFile, exc: Exception, where: str = "") -> InputError:
    """What a torn or corrupt archive stops the build with: the file, the codec, where it broke, and the fix."""
    return InputError(
        f"{f.uri}: cannot decompress ({f.compression}){where}: {exc}; check the file is whole (copy it again) or "
        "pass it uncompressed"
    )


# -- CSV and Parquet -------------------------------------------------------------------------------


def parse_line(source: str, line: int, raw: bytes) -> tuple[object, str] | Reject:
    """One JSONL line as (its JSON value, its text), or the reject that says why it is not JSON text."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Reject(
            source,
            line,
            "",
            "bad_utf8",
            f"not valid UTF-8 (byte {exc.start}: {raw[exc.start : exc.start + 1]!r})",
            raw[:RAW_PREVIEW].decode("utf-8", "replace"),
        )
    try:
        return json.loads(text), text
    except json.JSONDecodeError as exc:
        return Reject(source, line, "", "bad_json", json_reason(exc), text[:RAW_PREVIEW])
