"""The manifest: every item of a job with its request ID, rendered prompt, token estimate, bucket and shard.

Built in one streaming pass: blocks of rows are normalised and rendered in Polars, hashed with
hashlib, deduplicated against a set of keys (memory follows the keys, not the text), and dealt to a
small window of open shards round-robin within each length bucket, so every shard is a
representative mix of lengths. A shard is written once, as one Parquet file, when it fills; its
membership never changes. A re-run on grown input keeps every existing item where it is and puts only
new items into new shards. A generation record, written last, commits the build.
"""

import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import polars as pl
import pyarrow as pa

from batch_pipeline.core.manifest import ids
from batch_pipeline.core.money.cost import estimate_request_tokens
from batch_pipeline.core.errors import ReconciliationError
from batch_pipeline.core.manifest.batch_input import read_openai_batch
from batch_pipeline.core.manifest.inputs import KEY, LINE, Reject, RowBatch, read_batches, resolve_inputs
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.store import BackgroundWrites, Store

log = logging.getLogger(__name__)

BUCKET_EDGES = [64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
OPEN_SHARD_WINDOW = 8

ITEM_SCHEMA = pa.schema([
    ("request_id", pa.string()), ("shard_id", pa.string()), ("user_prompt", pa.string()),
    ("est_input_tokens", pa.int32()), ("length_bucket", pa.int8()), ("request_bytes", pa.int32()),
    ("source", pa.string()), ("line", pa.int64()), ("generation", pa.int32()),
])
ROW_SCHEMA = pa.schema([
    ("source", pa.string()), ("line", pa.int64()), ("source_key", pa.string()), ("request_id", pa.string()),
])
REJECT_SCHEMA = pa.schema([
    ("source", pa.string()), ("line", pa.int64()), ("field", pa.string()), ("kind", pa.string()),
    ("reason", pa.string()), ("raw", pa.string()),
])


@dataclass
class ManifestSummary:
    job: str
    generation: int
    input_files: int = 0
    input_rows: int = 0
    rejected_rows: int = 0
    accepted_rows: int = 0
    unique_requests: int = 0
    new_requests: int = 0
    duplicates_collapsed: int = 0
    shards_total: int = 0
    new_shards: list[str] = field(default_factory=list)
    est_input_tokens_new: int = 0
    seconds: float = 0.0
    rejects_by_reason: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def shard_name(number: int) -> str:
    return f"s{number:05d}"


def length_bucket(tokens: pl.Expr) -> pl.Expr:
    expr = pl.lit(len(BUCKET_EDGES), dtype=pl.Int8)
    for i, edge in reversed(list(enumerate(BUCKET_EDGES))):
        expr = pl.when(tokens <= edge).then(pl.lit(i, dtype=pl.Int8)).otherwise(expr)
    return expr


def render_expr(spec: JobSpec) -> pl.Expr:
    """The user message as a Polars expression over the normalised fields (literal pieces + columns)."""
    import string

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
    flags = frame.select([
        pl.any_horizontal(
            *[pl.col(n).str.contains(hint, literal=True) for hint in _ASCII_HINTS],
            *[pl.col(n).cast(pl.Binary).bin.contains(hint) for hint in _LEAD_BYTE_HINTS],
        ).fill_null(False).alias(n)
        for n in names
    ])
    columns = []
    for n in names:
        col = frame.get_column(n)
        rows = flags.get_column(n).arg_true()
        if len(rows):
            col = col.scatter(rows, col.gather(rows).str.replace_all(ids.ABNORMAL_WHITESPACE, " "))
        columns.append(col.str.strip_chars(ids.WHITESPACE_CHARS).alias(n))
    return frame.with_columns(columns)


class _OpenShard:
    __slots__ = ("number", "count", "bytes", "frames")

    def __init__(self, number: int):
        self.number, self.count, self.bytes, self.frames = number, 0, 0, []


REQUEST_FRAMING_BYTES = 512  # per batch line besides the user text: custom_id, settings, schema, JSON framing


@dataclass(frozen=True)
class ShardCaps:
    """The tighter of the job's shard limits and the backend's own batch limits."""

    max_requests: int
    max_bytes: int

    @classmethod
    def of(cls, spec: JobSpec, backend_max_requests: int | None = None,
           backend_max_bytes: int | None = None) -> "ShardCaps":
        return cls(min(spec.shards.max_requests, backend_max_requests or spec.shards.max_requests),
                   min(spec.shards.max_bytes, backend_max_bytes or spec.shards.max_bytes))


class ManifestBuilder:
    def __init__(self, spec: JobSpec, store: Store, progress: Callable[[str, int], None] | None = None,
                 caps: ShardCaps | None = None):
        self.spec, self.store, self.paths = spec, store, JobPaths(spec.name)
        self.progress = progress
        self.caps = caps or ShardCaps.of(spec)
        self.manifest = Manifest(spec.name, store)
        self._written: dict[str, int] = {}

    def build(self) -> ManifestSummary:
        started = time.perf_counter()
        spec = self.spec
        gen = self.manifest.last_generation() + 1
        summary = ManifestSummary(job=spec.name, generation=gen)
        # IDs of earlier generations, and the IDs this generation adds: disjoint, so memory follows the keys once
        prior: set[str] = set(self.manifest.item_index(columns=["request_id"]).column("request_id").to_pylist())
        fresh: set[str] = set()
        reused: set[str] = set()  # earlier IDs that occur again in this generation's input
        existing = len(prior)
        next_shard = self.manifest.max_shard_number() + 1
        files = resolve_inputs(spec.input.path, spec.input.format, spec.input_base_dir())
        summary.input_files = len(files)
        fields = spec.prompt.fields
        prefix = ids.id_prefix(spec.prompt.version, spec.model, spec.settings_fingerprint())
        system_bytes = len(spec.prompt.system.encode())
        rows_ahead = _count_rows(files, enough=existing + OPEN_SHARD_WINDOW * self.caps.max_requests) - existing
        window = max(1, min(OPEN_SHARD_WINDOW, math.ceil(max(rows_ahead, 1) / self.caps.max_requests)))
        line_overhead = REQUEST_FRAMING_BYTES + system_bytes
        max_requests, max_bytes = self.caps.max_requests, self.caps.max_bytes
        open_shards = [_OpenShard(next_shard + i) for i in range(window)]
        next_shard += window
        turn = 0
        rejects: list[Reject] = []
        # row groups (in order, one thread) and shard files (two threads: when they fall behind, the main thread
        # waits and both cores compress) are written in the background: Parquet and zstd release the GIL
        with self.store.parquet_writer(self.paths.rows(gen), ROW_SCHEMA) as rows_out, \
                BackgroundWrites(depth=2) as row_writes, BackgroundWrites(depth=4, workers=2) as writes:
            for f in files:
                batches = (read_openai_batch(f, fields, spec.input.key_field, spec.prompt.system, spec.model)
                           if f.format == "openai_batch" else read_batches(f, fields, spec.input.key_field))
                for batch in batches:
                    summary.input_rows += batch.frame.height + len(batch.rejects)
                    rejects.extend(batch.rejects)
                    frame = self._prepare(batch, rejects, system_bytes)
                    if frame.height == 0:
                        continue
                    # hash the UTF-8 bytes as Arrow holds them (no decode to str and encode back)
                    rids = ids.request_ids(prefix, frame["user_prompt"].cast(pl.Binary).to_list())
                    frame = frame.with_columns(pl.Series("request_id", rids, dtype=pl.String))
                    row_writes.submit(_write_rows, rows_out, frame.select(LINE, KEY, "request_id"), batch.source)
                    summary.accepted_rows += frame.height
                    # dedup, then deal the block's new items to the open shards round-robin in a stratified
                    # order (each bucket spread evenly over the sequence): whenever a shard fills, it holds
                    # every bucket in proportion, and the open shards fill evenly
                    keep: list[bool] = []
                    for rid in rids:
                        if rid in fresh:
                            keep.append(False)
                        elif rid in prior:
                            reused.add(rid)
                            keep.append(False)
                        else:
                            fresh.add(rid)
                            keep.append(True)
                    sizes = frame["request_bytes"].to_list()
                    assign = [0] * len(keep)
                    full: list[_OpenShard] = []
                    for i in _stratified_order(frame, keep):
                        slot = turn % window
                        turn += 1
                        shard = open_shards[slot]
                        nbytes = sizes[i] + line_overhead
                        if shard.count >= max_requests or shard.bytes + nbytes > max_bytes:
                            full.append(shard)  # closed once this block's rows are in it
                            shard = open_shards[slot] = _OpenShard(next_shard)
                            next_shard += 1
                        shard.count += 1
                        shard.bytes += nbytes
                        assign[i] = shard.number
                    assign = [a for a, k in zip(assign, keep) if k]
                    new = frame.filter(pl.Series(keep)).with_columns(pl.Series("_shard", assign, dtype=pl.Int64))
                    by_number = {s.number: s for s in [*open_shards, *full]}
                    for (number,), part in new.partition_by("_shard", as_dict=True).items():
                        by_number[number].frames.append(part.with_columns(pl.lit(batch.source).alias("source")))
                    for shard in full:
                        self._close(shard, gen, summary, writes)
                    summary.new_requests += new.height
                    summary.est_input_tokens_new += int(new["est_input_tokens"].sum() or 0)
                    if self.progress:
                        self.progress(f.uri, summary.input_rows)
            for shard in open_shards:
                self._close(shard, gen, summary, writes)
        written = sum(self._written.values())
        if written != summary.new_requests:
            raise ReconciliationError(f"manifest {spec.name} gen {gen}: {summary.new_requests} new items but "
                                      f"{written} written to shards (nothing committed)")
        summary.new_shards.sort()
        self._write_rejects(gen, rejects)
        summary.rejected_rows = len(rejects)
        for r in rejects:
            summary.rejects_by_reason[r.kind] = summary.rejects_by_reason.get(r.kind, 0) + 1
        summary.unique_requests = existing + summary.new_requests
        # accepted rows minus the distinct IDs among them (the new ones and the earlier ones that recur)
        summary.duplicates_collapsed = summary.accepted_rows - summary.new_requests - len(reused)
        summary.shards_total = len(self.manifest.shard_ids()) + len(summary.new_shards)
        summary.seconds = round(time.perf_counter() - started, 3)
        self.store.write_json(self.paths.generation(gen), summary.as_dict())  # the commit point
        log.info("manifest %s gen %d: %d rows, %d rejected, %d new requests in %d new shards (%.1fs)",
                 spec.name, gen, summary.input_rows, summary.rejected_rows, summary.new_requests,
                 len(summary.new_shards), summary.seconds)
        return summary

    def _prepare(self, batch: RowBatch, rejects: list[Reject], system_bytes: int) -> pl.DataFrame:
        """Normalise fields, render the prompt, estimate tokens; empty or over-long rows become rejects."""
        spec = self.spec
        fields = spec.prompt.fields
        text = spec.input.text_field
        frame = normalise_fields(batch.frame, fields)
        frame = frame.with_columns(render_expr(spec).alias("user_prompt"))
        frame = frame.with_columns(pl.col("user_prompt").str.len_bytes().cast(pl.Int32).alias("request_bytes"))
        frame = frame.with_columns(
            estimate_request_tokens(pl.col("request_bytes"), system_bytes).cast(pl.Int32).alias("est_input_tokens"))
        limit = spec.input.max_input_tokens
        max_bytes = self.caps.max_bytes - REQUEST_FRAMING_BYTES - system_bytes
        empty = pl.col(text).str.len_bytes() == 0
        too_long = pl.col("est_input_tokens") > limit
        too_big = pl.col("request_bytes") > max_bytes
        bad = frame.filter(empty | too_long | too_big)
        for line, value, tokens, nbytes in bad.select(LINE, text, "est_input_tokens", "request_bytes").iter_rows():
            if not value:
                rejects.append(Reject(batch.source, line, text, "empty_text",
                                      f"empty text in field '{text}' after whitespace normalisation"))
            elif tokens > limit:
                rejects.append(Reject(batch.source, line, text, "too_long",
                                      f"request of ~{tokens} tokens exceeds input.max_input_tokens={limit}", value[:200]))
            else:
                rejects.append(Reject(batch.source, line, text, "too_large",
                                      f"request of {nbytes} bytes does not fit a batch of {self.caps.max_bytes} bytes",
                                      value[:200]))
        if bad.height:
            frame = frame.filter(~(empty | too_long | too_big))
        return frame.with_columns(length_bucket(pl.col("est_input_tokens")).alias("length_bucket"))

    def _close(self, shard: _OpenShard, gen: int, summary: ManifestSummary,
               writes: BackgroundWrites | None = None) -> None:
        if shard.count == 0:
            return
        sid = shard_name(shard.number)
        frames, shard.frames = shard.frames, []
        summary.new_shards.append(sid)
        if writes is None:
            self._write_shard(sid, frames, gen)
        else:
            writes.submit(self._write_shard, sid, frames, gen)

    def _write_shard(self, sid: str, frames: list[pl.DataFrame], gen: int) -> None:
        frame = pl.concat(frames).sort("request_id")
        table = frame.select(
            "request_id", pl.lit(sid).alias("shard_id"), "user_prompt", "est_input_tokens", "length_bucket",
            "request_bytes", "source", pl.col(LINE).alias("line"), pl.lit(gen).alias("generation"),
        ).to_arrow().cast(ITEM_SCHEMA)
        self.store.write_table(self.paths.shard_items(sid), table)
        self._written[sid] = table.num_rows

    def _write_rejects(self, gen: int, rejects: list[Reject]) -> None:
        cols = {name: [getattr(r, name) for r in rejects] for name in REJECT_SCHEMA.names}
        # built by Polars: pyarrow's list conversion imports pandas (~0.4 s)
        table = pl.DataFrame(cols, schema={f.name: pl.Int64 if f.name == "line" else pl.String for f in REJECT_SCHEMA})
        self.store.write_table(self.paths.rejects(gen), table.to_arrow().cast(REJECT_SCHEMA))


def _stratified_order(frame: pl.DataFrame, keep: list[bool]) -> list[int]:
    """The rows to keep, reordered so that every length bucket is spread evenly over the sequence: key = (rank of
    the request ID within its bucket + 0.5) / bucket size, ties by bucket then position."""
    order = (
        frame.select("request_id", "length_bucket")
        .with_row_index("_i")
        .filter(pl.Series(keep, dtype=pl.Boolean))
        .with_columns(((pl.col("request_id").rank("ordinal").over("length_bucket").cast(pl.Float64) - 0.5)
                       / pl.len().over("length_bucket").cast(pl.Float64)).alias("_key"))
        .sort("_key", "length_bucket", "_i")
    )
    return order.get_column("_i").to_list()


def _write_rows(writer, frame: pl.DataFrame, source: str) -> None:
    writer.write_table(frame.select(pl.lit(source).alias("source"), pl.col(LINE).alias("line"),
                                    pl.col(KEY).alias("source_key"), "request_id").to_arrow().cast(ROW_SCHEMA))


def _count_rows(files, enough: int | None = None) -> int:
    """A cheap upper bound of the rows to come, to size the window of open shards.

    Counting stops once ``enough`` rows are seen: past that the window is full whatever the total, so only the
    head of a large input is read.
    """
    total = 0
    for f in files:
        if enough is not None and total >= enough:
            break
        if f.format == "parquet":
            import pyarrow.parquet as pq

            with f.fs.open_input_file(f.path) as h:
                total += pq.ParquetFile(h).metadata.num_rows
        else:
            with f.fs.open_input_stream(f.path) as stream:
                while chunk := stream.read(8 * 2**20):
                    total += chunk.count(b"\n")
                    if enough is not None and total >= enough:
                        break
    return total


class Manifest:
    """Read side of a job's committed manifest generations."""

    def __init__(self, job: str, store: Store):
        self.job, self.store, self.paths = job, store, JobPaths(job)

    def generations(self) -> list[dict]:
        out = [self.store.read_json(p) for p in self.store.list_files(self.paths.generations, suffix=".json")]
        return [g for g in out if g]

    def last_generation(self) -> int:
        gens = self.generations()
        return max((g["generation"] for g in gens), default=0)

    def latest(self) -> dict | None:
        gens = self.generations()
        return max(gens, key=lambda g: g["generation"]) if gens else None

    def shard_ids(self) -> list[str]:
        return sorted(s for g in self.generations() for s in g["new_shards"])

    def max_shard_number(self) -> int:
        return max((int(s[1:]) for s in self.shard_ids()), default=0)

    def shard_items(self, shard_id: str, columns: list[str] | None = None) -> pa.Table:
        table = self.store.read_part(self.paths.shard_items(shard_id), columns)
        if table is None:
            raise FileNotFoundError(f"manifest of job {self.job} has no readable items for shard {shard_id}")
        return table

    def item_index(self, columns: list[str] | None = None) -> pa.Table:
        cols = columns or ["request_id", "shard_id", "est_input_tokens", "length_bucket"]
        tables = [self.shard_items(s, cols) for s in self.shard_ids()]
        return pa.concat_tables(tables) if tables else _empty(pa.schema([ITEM_SCHEMA.field(c) for c in cols]))

    def rows(self) -> pa.Table:
        gen = self.last_generation()
        t = self.store.read_part(self.paths.rows(gen)) if gen else None
        return t if t is not None else _empty(ROW_SCHEMA)

    def rejects(self) -> pa.Table:
        gen = self.last_generation()
        t = self.store.read_part(self.paths.rejects(gen)) if gen else None
        return t if t is not None else _empty(REJECT_SCHEMA)


def _empty(schema: pa.Schema) -> pa.Table:
    """An empty table (``Schema.empty_table`` imports pandas, ~0.4 s)."""
    return pa.Table.from_batches([], schema=schema)


def build_manifest(spec: JobSpec, store: Store, progress: Callable[[str, int], None] | None = None,
                   caps: ShardCaps | None = None) -> ManifestSummary:
    return ManifestBuilder(spec, store, progress, caps).build()
