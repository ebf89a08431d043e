"""Chat turns as job input (``input.messages_field``): read, check and normalise each row's turns.

A row's value is a list of ``{"role", "content"}`` turns, text only. The rule for the turns:

- roles are ``user`` and ``assistant``, alternating, first and last ``user`` (the model answers the last one);
- a ``system`` turn is accepted only as the first turn and only when its text equals ``prompt.system`` (after
  whitespace normalisation): it is dropped, because the system prompt is job-level, part of every request ID
  and of the cached prefix. Any other system turn rejects the row (``system_turn``) rather than re-prompting;
- each content is a non-empty string after ``ids.normalize_text``; a turn has no keys besides role and content.

An accepted row becomes its canonical JSON, ``[{"role":"user","content":"..."},...]`` with no spaces and
non-ASCII kept: that text is the item's ``user_prompt`` (``ItemShape.TURNS``) and what the request ID hashes.
It is also the ``messages`` array of OpenAI, Anthropic and Bedrock requests, which splice it in as it is.
A bad row becomes a reject naming the line and the field (``messages[2].content``).
"""

import json
from collections.abc import Iterator

import polars as pl
import pyarrow.parquet as pq

from batch_pipeline.core.errors import InputError
from batch_pipeline.core.manifest import ids
from batch_pipeline.core.manifest.reasons import json_type
from batch_pipeline.core.manifest.rows import (
    KEY,
    LINE,
    RAW_PREVIEW,
    InputFile,
    ReadExtent,
    Reject,
    RowBatch,
    line_blocks,
    parse_line,
)

ROLES = ("user", "assistant")
BLOCK_ROWS = 50_000


class TurnError(ValueError):
    """Why a row's turns are rejected: the field path, the reject kind and the reason."""

    def __init__(self, field: str, kind: str, reason: str):
        super().__init__(reason)
        self.field, self.kind, self.reason = field, kind, reason


def canonical_turns(value: object, field: str, system: str) -> str:
    """The row's turns as canonical JSON; raises ``TurnError``. ``system``: the job's system prompt."""
    if not isinstance(value, list):
        raise TurnError(
            field, "wrong_type", f"field '{field}' must be a list of {{role, content}} turns, got {json_type(value)}"
        )
    if not value:
        raise TurnError(field, "empty_messages", f"field '{field}' is an empty list of turns")
    turns: list[dict[str, str]] = []
    for i, turn in enumerate(value):
        at = f"{field}[{i}]"
        if not isinstance(turn, dict):
            raise TurnError(at, "bad_turn", f"{at} must be an object with role and content, got {json_type(turn)}")
        extra = sorted(k for k, v in turn.items() if k not in ("role", "content") and v is not None)
        if extra:
            raise TurnError(at, "bad_turn", f"{at} has keys besides role and content: {extra}")
        for key in ("role", "content"):
            if turn.get(key) is None:
                raise TurnError(f"{at}.{key}", "missing_field", f"{at} has no {key}")
            if not isinstance(turn[key], str):
                raise TurnError(
                    f"{at}.{key}", "wrong_type", f"{at}.{key} must be a string (text only), got {json_type(turn[key])}"
                )
        role, content = turn["role"], ids.normalize_text(turn["content"])
        if role == "system":
            if i == 0 and content == ids.normalize_text(system):
                continue  # the job's own system prompt: it is sent (and hashed) once, as prompt.system
            where = "differs from prompt.system" if i == 0 else "is not the first turn"
            raise TurnError(
                f"{at}.role",
                "system_turn",
                f"{at} is a system turn that {where}; the system prompt is job-level (prompt.system)",
            )
        if role not in ROLES:
            raise TurnError(f"{at}.role", "unknown_role", f"{at}.role must be user or assistant, got {role!r:.40}")
        want = ROLES[len(turns) % 2]
        if role != want:
            raise TurnError(
                f"{at}.role", "turn_order", f"{at} must be a {want} turn (user and assistant alternate, user first)"
            )
        if not content:
            raise TurnError(f"{at}.content", "empty_text", f"{at}.content is empty after whitespace normalisation")
        turns.append({"role": role, "content": content})
    if not turns:
        raise TurnError(field, "empty_messages", f"field '{field}' holds only the system turn")
    if turns[-1]["role"] != "user":
        at = f"{field}[{len(value) - 1}]"
        raise TurnError(
            f"{at}.role", "turn_order", f"{at} is the last turn and must be the user's (the model answers it)"
        )
    text = json.dumps(turns, ensure_ascii=False, separators=(",", ":"))
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise TurnError(
            field, "bad_utf8", f"field '{field}' holds text that is not valid UTF-8 (a lone surrogate at {exc.start})"
        ) from None
    return text


class _Rows:
    """Accepted rows and rejects of one block of a file."""

    def __init__(self, source: str, field: str, key_field: str | None, system: str):
        self.source, self.field, self.key_field, self.system = source, field, key_field, system
        self.turns: list[str] = []
        self.lines: list[int] = []
        self.keys: list[str | None] = []
        self.rejects: list[Reject] = []

    def add(self, row: object, line: int, raw: str) -> None:
        if not isinstance(row, dict):
            self.rejects.append(
                Reject(
                    self.source,
                    line,
                    "",
                    "not_object",
                    f"expected a JSON object, got {json_type(row)}",
                    raw[:RAW_PREVIEW],
                )
            )
            return
        value = row.get(self.field)
        if value is None:
            self.rejects.append(
                Reject(
                    self.source,
                    line,
                    self.field,
                    "missing_field",
                    f"missing or null field '{self.field}'",
                    raw[:RAW_PREVIEW],
                )
            )
            return
        try:
            text = canonical_turns(value, self.field, self.system)
        except TurnError as exc:
            self.rejects.append(Reject(self.source, line, exc.field, exc.kind, exc.reason, raw[:RAW_PREVIEW]))
            return
        key = row.get(self.key_field) if self.key_field else None
        self.turns.append(text)
        self.lines.append(line)
        self.keys.append(None if key is None else key if isinstance(key, str) else json.dumps(key))

    def batch(self) -> RowBatch:
        frame = pl.DataFrame(
            {self.field: self.turns, LINE: self.lines, KEY: self.keys},
            schema={self.field: pl.String, LINE: pl.Int64, KEY: pl.String},
        )
        return RowBatch(self.source, frame, self.rejects)


def read_messages(
    f: InputFile,
    field: str,
    key_field: str | None,
    system: str,
    offset: int = 0,
    first_line: int = 1,
    extent: ReadExtent | None = None,
) -> Iterator[RowBatch]:
    """Batches of ``f`` whose ``field`` column is each row's canonical turns JSON (JSONL from byte ``offset``,
    or Parquet with a list-of-struct column); ``extent`` is filled in as for ``inputs.read_batches``."""
    extent = extent if extent is not None else ReadExtent()
    if f.format == "parquet":
        if offset:
            raise ValueError(f"{f.uri}: only JSONL is read from an offset")
        yield from _parquet(f, field, key_field, system)
        extent.bytes_read, extent.ends_clean = f.size, False
        return
    if f.format != "jsonl":
        raise ValueError(f"{f.uri}: input.messages_field reads JSONL or Parquet, not {f.format}")
    yield from _jsonl(f, field, key_field, system, offset, first_line, extent)


def _jsonl(
    f: InputFile, field: str, key_field: str | None, system: str, offset: int, first_line: int, extent: ReadExtent
) -> Iterator[RowBatch]:
    """Line by line (json.loads): a messages row is nested, and each turn is checked on its own."""
    for line, block in line_blocks(f, offset, first_line, extent):
        raw_lines = block.split(b"\n")[:-1] if block.endswith(b"\n") else [block]
        rows = _Rows(f.uri, field, key_field, system)
        for at, raw in enumerate(raw_lines, start=line):
            _line(rows, raw, at)
        yield rows.batch()


def _line(rows: _Rows, raw: bytes, line: int) -> None:
    if not raw.strip():
        return
    parsed = parse_line(rows.source, line, raw)
    if isinstance(parsed, Reject):
        rows.rejects.append(parsed)
        return
    obj, text = parsed
    rows.add(obj, line, text)


def _parquet(f: InputFile, field: str, key_field: str | None, system: str) -> Iterator[RowBatch]:
    with f.fs.open_input_file(f.path) as handle:
        pf = pq.ParquetFile(handle)
        names = pf.schema_arrow.names
        if field not in names:
            raise InputError(f"{f.uri}: has no column {field!r}; columns are {names}")
        cols = [c for c in dict.fromkeys([field, *([key_field] if key_field else [])]) if c in names]
        line = 1
        for batch in pf.iter_batches(batch_size=BLOCK_ROWS, columns=cols):
            rows = _Rows(f.uri, field, key_field, system)
            for row in batch.to_pylist():
                rows.add(row, line, "")
                line += 1
            yield rows.batch()
