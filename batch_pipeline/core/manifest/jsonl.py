"""JSONL input: a fast path parses a whole block with Arrow's JSON reader; a block that contains anything odd
(broken JSON, a number where text belongs, invalid UTF-8) is re-read line by line so that every bad row is named
by file, line and field while the good rows around it go on."""

import json
import logging
from collections.abc import Iterator

import polars as pl
import pyarrow as pa
import pyarrow.json as pajson

from batch_pipeline.core.manifest.reasons import json_type
from batch_pipeline.core.manifest.rows import (
    KEY,
    LINE,
    RAW_PREVIEW,
    InputFile,
    ReadExtent,
    Reject,
    RowBatch,
    bad_field,
    empty_frame,
    line_blocks,
    parse_line,
    split_missing,
)

log = logging.getLogger(__name__)


# -- JSONL ---------------------------------------------------------------------------------------
def read_jsonl(
    f: InputFile, fields: list[str], key_field: str | None, offset: int, first_line: int, extent: ReadExtent
) -> Iterator[RowBatch]:
    """Reads the bytes ``[offset, f.size)``: a writer appending meanwhile is read by the next generation."""
    wanted = list(dict.fromkeys(fields + ([key_field] if key_field else [])))
    schema = pa.schema([(name, pa.string()) for name in wanted])
    options = pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    for line, block in line_blocks(f, offset, first_line, extent):
        yield _jsonl_block(f.uri, block, line, fields, key_field, options)


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


def _clean_line_count(block: bytes) -> int | None:
    """The number of lines of a block that ends with a newline and has no line that is blank or starts with
    whitespace (so no line needs the per-line filter); None otherwise."""
    if not block.endswith(b"\n"):
        return None
    ends = line_ends(block)
    return None if first_bytes(block, ends).is_in(_STRIP_BYTES).any() else len(ends)


def _jsonl_block(
    source: str,
    block: bytes,
    first_line: int,
    fields: list[str],
    key_field: str | None,
    options: pajson.ParseOptions,
) -> RowBatch:
    n = _clean_line_count(block)
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
        return split_missing(source, frame, fields, lambda: block.split(b"\n"))
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
        return RowBatch(source, empty_frame(fields))
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
    return split_missing(source, frame, fields, lambda: raw_lines)


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
        parsed = parse_line(source, line, raw)
        if isinstance(parsed, Reject):
            rejects.append(parsed)
            continue
        row, text = parsed
        if not isinstance(row, dict):
            rejects.append(
                Reject(
                    source, line, "", "not_object", f"expected a JSON object, got {json_type(row)}", text[:RAW_PREVIEW]
                )
            )
            continue
        bad = bad_field(row, fields)
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
