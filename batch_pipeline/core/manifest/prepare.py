"""Per input file: read, normalise, render, estimate and hash, block by block (the part that scales out).

Everything here depends on the job spec and the input file only, never on earlier generations, so a file can
be prepared on its own (a step, a pod) and the prepared blocks merged later (``parts``); the merge then deals
exactly the blocks a one-process build would have dealt.
"""

from collections.abc import Iterator
from dataclasses import dataclass, field

import polars as pl

from batch_pipeline.core.manifest import ids
from batch_pipeline.core.manifest.batch_input import read_openai_batch
from batch_pipeline.core.manifest.incremental import FilePlan
from batch_pipeline.core.manifest.inputs import prefetch, read_batches
from batch_pipeline.core.manifest.messages import read_messages
from batch_pipeline.core.manifest.rows import LINE, ReadExtent, Reject, RowBatch
from batch_pipeline.core.pricing.cost import estimate_request_tokens
from batch_pipeline.core.spec.job import JobSpec

BUCKET_EDGES = [64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
REQUEST_FRAMING_BYTES = 512  # per batch line besides the user text: custom_id, settings, schema, JSON framing
# a prepared block: what dealing needs, plus the source key for the rows table
BLOCK_COLUMNS = [
    "request_id",
    "user_prompt",
    "est_input_tokens",
    "length_bucket",
    "request_bytes",
    LINE,
    "source",
    "_key",
]


@dataclass
class Block:
    """One block of a file, prepared: its accepted rows (``BLOCK_COLUMNS``), how many rows it read, its rejects."""

    source: str
    rows_in: int
    frame: pl.DataFrame
    rejects: list[Reject] = field(default_factory=list)
    request_ids: list[str] | None = None  # the frame's IDs as Python strings, when they were made here

    def ids(self) -> list[str]:
        return self.request_ids if self.request_ids is not None else self.frame.get_column("request_id").to_list()


def length_bucket(tokens: pl.Expr) -> pl.Expr:
    expr = pl.lit(len(BUCKET_EDGES), dtype=pl.Int8)
    for i, edge in reversed(list(enumerate(BUCKET_EDGES))):
        expr = pl.when(tokens <= edge).then(pl.lit(i, dtype=pl.Int8)).otherwise(expr)
    return expr


def render_expr(spec: JobSpec) -> pl.Expr:
    """The user message as a Polars expression over the normalised fields (literal pieces + columns); a messages
    job's rows already hold their canonical turns (``messages.read_messages``)."""
    import string

    if spec.input.messages_field is not None:
        return pl.col(spec.input.messages_field)

    parts: list[pl.Expr] = []
    for literal, name, _, _ in string.Formatter().parse(spec.prompt.template):
        if literal:
            parts.append(pl.lit(literal))
        if name is not None:
            parts.append(pl.col(name))
    return pl.concat_str(parts) if len(parts) > 1 else parts[0]


# A row can need the whitespace rewrite only if it holds two ASCII spaces in a row, an ASCII whitespace control
# character, or the UTF-8 lead byte of one of the other Unicode White_Space characters (U+0085 and U+00A0: C2;
# U+1680: E1; U+2000-U+205F: E2; U+3000: E3). These are literal searches (memchr/memmem), several times
# cheaper than the regex scan, which then runs only on the rows they flag.
_ASCII_HINTS = ["  ", "\t", "\n", "\x0b", "\x0c", "\r"]
_LEAD_BYTE_HINTS = [b"\xc2", b"\xe1", b"\xe2", b"\xe3"]
assert {c for c in ids.WHITESPACE_CHARS if c != " " and ord(c) < 0x80} == set("".join(_ASCII_HINTS[1:]))
assert {c.encode()[:1] for c in ids.WHITESPACE_CHARS if ord(c) >= 0x80} == set(_LEAD_BYTE_HINTS)


def normalise_fields(frame: pl.DataFrame, fields: list[str]) -> pl.DataFrame:
    """``ids.normalize_text`` on each field, column-wise: the ``ABNORMAL_WHITESPACE`` rewrite on the rows that
    may contain a match (a superset found by literal searches), then the strip on every row."""
    if frame.height == 0:
        return frame
    names = list(dict.fromkeys(fields))
    flags = frame.select(
        [
            pl.any_horizontal(
                *[pl.col(n).str.contains(hint, literal=True) for hint in _ASCII_HINTS],
                *[pl.col(n).cast(pl.Binary).bin.contains(hint) for hint in _LEAD_BYTE_HINTS],
            )
            .fill_null(False)
            .alias(n)
            for n in names
        ]
    )
    columns = []
    for n in names:
        col = frame.get_column(n)
        rows = flags.get_column(n).arg_true()
        if len(rows):
            col = col.scatter(rows, col.gather(rows).str.replace_all(ids.ABNORMAL_WHITESPACE, " "))
        columns.append(col.str.strip_chars(ids.WHITESPACE_CHARS).alias(n))
    return frame.with_columns(columns)


class FilePreparer:
    """Reads and prepares the blocks of one file as its plan says (whole, or from an append's offset)."""

    def __init__(self, spec: JobSpec, max_bytes: int):
        """``max_bytes``: the shard byte cap (a request that cannot fit one is rejected)."""
        self.spec, self.max_shard_bytes = spec, max_bytes
        self.prefix = ids.id_prefix(spec.prompt.version, spec.model, spec.settings_fingerprint())
        # the shared prefix every request sends: the system prompt and the few-shot examples
        self.system_bytes = len(spec.prompt.prefix_text.encode())

    def blocks(self, plan: FilePlan, extent: ReadExtent) -> Iterator[Block]:
        """The file's blocks in order; ``extent`` says how far the read got once they are all taken."""
        spec, f = self.spec, plan.file
        fields = spec.prompt.fields
        turns = spec.input.messages_field
        if f.format == "openai_batch":
            batches = read_openai_batch(
                f,
                [turns] if turns else fields,
                spec.input.key_field,
                spec.prompt.system,
                spec.model,
                messages_field=turns,
            )
        elif turns is not None:
            batches = read_messages(
                f, turns, spec.input.key_field, spec.prompt.system, plan.offset, plan.first_line, extent
            )
        else:
            batches = read_batches(f, fields, spec.input.key_field, plan.offset, plan.first_line, extent)
        for source, rows_in, frame, rejects in prefetch(self._prepared(batches)):
            rids: list[str] = []
            if frame.height:
                # hash the UTF-8 bytes as Arrow holds them (no decode to str and encode back)
                hashed = frame["user_prompt"]
                if ids.UPSTREAM_OUTPUT in frame.columns:  # a pass over another job's answers: ids.with_upstream
                    hashed = frame.select(
                        pl.concat_str([pl.col("user_prompt"), pl.lit(ids.ID_SEPARATOR), pl.col(ids.UPSTREAM_OUTPUT)])
                    ).to_series()
                rids = ids.request_ids(self.prefix, hashed.cast(pl.Binary).to_list())
                frame = frame.with_columns(
                    pl.Series("request_id", rids, dtype=pl.String), pl.lit(source).alias("source")
                ).select(BLOCK_COLUMNS)
            yield Block(source, rows_in, frame, rejects, rids)
        if f.format == "openai_batch":
            extent.bytes_read, extent.lines, extent.ends_clean = f.size, 0, False

    def _prepared(self, batches: Iterator[RowBatch]) -> Iterator[tuple[str, int, pl.DataFrame, list[Reject]]]:
        """(source, rows read, prepared frame, rejects) per block: the part of the work that releases the GIL."""
        for batch in batches:
            rows_in = batch.frame.height + len(batch.rejects)
            rejects = list(batch.rejects)
            yield batch.source, rows_in, self._prepare(batch, rejects), rejects

    def _prepare(self, batch: RowBatch, rejects: list[Reject]) -> pl.DataFrame:
        """Normalise fields, render the prompt, estimate tokens; empty or over-long rows become rejects."""
        spec, system_bytes = self.spec, self.system_bytes
        fields = spec.prompt.fields
        text = spec.input.text_field or spec.input.messages_field
        assert text is not None
        # a messages row's turns were normalised one by one as they were read
        frame = normalise_fields(batch.frame, fields) if spec.input.messages_field is None else batch.frame
        frame = frame.with_columns(render_expr(spec).alias("user_prompt"))
        frame = frame.with_columns(pl.col("user_prompt").str.len_bytes().cast(pl.Int32).alias("request_bytes"))
        frame = frame.with_columns(
            estimate_request_tokens(pl.col("request_bytes"), system_bytes).cast(pl.Int32).alias("est_input_tokens")
        )
        limit = spec.input.max_input_tokens
        max_bytes = self.max_shard_bytes - REQUEST_FRAMING_BYTES - system_bytes
        empty = pl.col(text).str.len_bytes() == 0
        too_long = pl.col("est_input_tokens") > limit
        too_big = pl.col("request_bytes") > max_bytes
        bad = frame.filter(empty | too_long | too_big)
        for line, value, tokens, nbytes in bad.select(LINE, text, "est_input_tokens", "request_bytes").iter_rows():
            if not value:
                rejects.append(
                    Reject(
                        batch.source,
                        line,
                        text,
                        "empty_text",
                        f"empty text in field '{text}' after whitespace normalisation",
                    )
                )
            elif tokens > limit:
                rejects.append(
                    Reject(
                        batch.source,
                        line,
                        text,
                        "too_long",
                        f"request of ~{tokens} tokens exceeds input.max_input_tokens={limit}",
                        value[:200],
                    )
                )
            else:
                rejects.append(
                    Reject(
                        batch.source,
                        line,
                        text,
                        "too_large",
                        f"request of {nbytes} bytes does not fit a batch of {self.max_shard_bytes} bytes",
                        value[:200],
                    )
                )
        if bad.height:
            frame = frame.filter(~(empty | too_long | too_big))
        return frame.with_columns(length_bucket(pl.col("est_input_tokens")).alias("length_bucket"))
