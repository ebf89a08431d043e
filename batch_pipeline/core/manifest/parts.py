"""Input files prepared on their own, then merged: the manifest beyond one machine.

``prepare_file_part`` reads one input file as the next generation would (whole, or from an append's offset),
normalises, renders and hashes it, and stores the prepared blocks as a part (one Parquet row group per block,
its rejects, and a record written last). Parts of different files are independent, so each can run in its own
process or pod. The merge is an ordinary build given ``FileParts``: for every file whose part matches the
file's current identity and plan it deals the stored blocks instead of reading the file, so it does only
the dedup against the on-disk index and the dealing, and its shards are exactly a one-process build's.
"""

import hashlib
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from batch_pipeline.core.manifest.incremental import FilePlan, plan_files
from batch_pipeline.core.manifest.inputs import resolve_inputs
from batch_pipeline.core.manifest.prepare import BLOCK_COLUMNS, Block, FilePreparer
from batch_pipeline.core.manifest.read import REJECT_SCHEMA, Manifest
from batch_pipeline.core.manifest.rows import LINE, InputFile, ReadExtent, Reject
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store


def part_key(uri: str) -> str:
    """A stable partition key for an input file: its name (made safe) and a digest of its URI."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", uri.rstrip("/").rsplit("/", 1)[-1])[:60]
    return f"{name}-{hashlib.sha256(uri.encode()).hexdigest()[:12]}"


@dataclass
class PartRecord:
    """What a part holds: the file identity and plan it was prepared for, and its blocks' row counts."""

    uri: str
    size: int
    mtime_ns: int | None
    offset: int
    first_line: int
    bytes_read: int
    lines: int
    ends_clean: bool
    blocks_rows_in: list[int] = field(default_factory=list)  # rows read per block
    blocks_rows: list[int] = field(default_factory=list)  # prepared rows per block (0: no row group)

    def matches(self, plan: FilePlan) -> bool:
        f = plan.file
        return (self.uri, self.size, self.mtime_ns, self.offset) == (f.uri, f.size, f.mtime_ns, plan.offset)


def input_files(spec: JobSpec) -> list[InputFile]:
    return resolve_inputs(spec.input.path, spec.input.format, spec.input_base_dir())


def pending_files(spec: JobSpec, store: Store) -> list[FilePlan]:
    """The current input files the next generation has to read (new, grown or rewritten)."""
    return [p for p in plan_files(input_files(spec), Manifest(spec.name, store).file_states()) if p.reads]


def prepare_file_part(spec: JobSpec, store: Store, key: str, max_shard_bytes: int | None = None) -> PartRecord | None:
    """Prepare the input file whose ``part_key`` is ``key``; None when the next generation need not read it."""
    plan = next((p for p in pending_files(spec, store) if part_key(p.file.uri) == key), None)
    if plan is None:
        return None
    paths = JobPaths(spec.name)
    preparer = FilePreparer(spec, max_shard_bytes or spec.shards.max_bytes)
    extent = ReadExtent()
    record = PartRecord(plan.file.uri, plan.file.size, plan.file.mtime_ns, plan.offset, plan.first_line, 0, 0, False)
    rejects: list[Reject] = []
    with store.parquet_writer(paths.file_part(key, ".parquet"), _block_schema()) as writer:
        for block in preparer.blocks(plan, extent):
            record.blocks_rows_in.append(block.rows_in)
            record.blocks_rows.append(block.frame.height)
            rejects.extend(block.rejects)
            if block.frame.height:
                writer.write_table(block.frame.to_arrow(), row_group_size=block.frame.height)
    record.bytes_read, record.lines, record.ends_clean = extent.bytes_read, extent.lines, extent.ends_clean
    cols = {name: [getattr(r, name) for r in rejects] for name in REJECT_SCHEMA.names}
    table = pl.DataFrame(cols, schema={f.name: pl.Int64 if f.name == "line" else pl.String for f in REJECT_SCHEMA})
    store.write_table(paths.file_part(key, ".rejects.parquet"), table.to_arrow().cast(REJECT_SCHEMA))
    store.write_json(paths.file_part(key, ".json"), asdict(record))  # the part is complete once this exists
    return record


def _block_schema() -> pa.Schema:
    """The schema of a prepared block (Polars' Arrow types), from an empty frame of the block's columns."""
    types = {
        "request_id": pl.String,
        "user_prompt": pl.String,
        "est_input_tokens": pl.Int32,
        "length_bucket": pl.Int8,
        "request_bytes": pl.Int32,
        LINE: pl.Int64,
        "source": pl.String,
        "_key": pl.String,
    }
    return pl.DataFrame(schema={c: types[c] for c in BLOCK_COLUMNS}).to_arrow().schema


class FilePart:
    """A complete part: its blocks in the order they were prepared."""

    def __init__(self, store: Store, paths: JobPaths, key: str, record: PartRecord):
        self.store, self.paths, self.key, self.record = store, paths, key, record

    def blocks(self, extent: ReadExtent) -> Iterator[Block]:
        r = self.record
        rejects_table = self.store.read_part(self.paths.file_part(self.key, ".rejects.parquet"))
        rejects = [Reject(**row) for row in rejects_table.to_pylist()] if rejects_table is not None else []
        with self.store.fs.open_input_file(self.store.full(self.paths.file_part(self.key, ".parquet"))) as handle:
            pf = pq.ParquetFile(handle)
            group = 0
            last = len(r.blocks_rows) - 1
            for i, (rows_in, rows) in enumerate(zip(r.blocks_rows_in, r.blocks_rows)):
                frame = pl.DataFrame()
                if rows:
                    frame = pl.from_arrow(pf.read_row_group(group))  # type: ignore[assignment]
                    group += 1
                yield Block(r.uri, rows_in, frame, rejects if i == last else [])
        extent.bytes_read, extent.lines, extent.ends_clean = r.bytes_read, r.lines, r.ends_clean

    def delete(self) -> None:
        for suffix in (".json", ".parquet", ".rejects.parquet"):
            self.store.delete(self.paths.file_part(self.key, suffix))


class FileParts:
    """The parts of a job's input files; ``ready(plan)`` is the part prepared for exactly that plan, if any."""

    def __init__(self, spec: JobSpec, store: Store):
        self.store, self.paths = store, JobPaths(spec.name)
        self.used: list[FilePart] = []

    def ready(self, plan: FilePlan) -> FilePart | None:
        key = part_key(plan.file.uri)
        data = self.store.read_json(self.paths.file_part(key, ".json"))
        if not data:
            return None
        record = PartRecord(**data)
        if not record.matches(plan):
            return None  # prepared for another version of the file: the merge reads the file itself
        part = FilePart(self.store, self.paths, key, record)
        self.used.append(part)
        return part

    def discard_used(self) -> None:
        """Delete the parts a committed merge consumed (a re-run merge reads the files again)."""
        for part in self.used:
            part.delete()
        self.used.clear()
