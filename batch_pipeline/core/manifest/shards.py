"""The manifest: every item of a job with its request ID, rendered prompt, token estimate, bucket and shard.

Built in one streaming pass over the input files this generation has to read (new, grown or rewritten ones;
unchanged files are skipped, ``incremental``): blocks of rows are normalised and rendered in Polars, hashed
with hashlib, deduplicated in bounded memory (``dedup``: sets while they fit, hash-range spill past that) and
dealt to a small window of open shards (``deal``). A shard's membership never changes: a re-run on grown
input keeps every existing item where it is and puts only new items into new shards. A generation record,
written last, commits the build and says what was done with each input file.
"""

import functools
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import polars as pl
from pydantic import Field

from batch_pipeline.core import progress as meters
from batch_pipeline.core.errors import ReconciliationError
from batch_pipeline.core.manifest.deal import OPEN_SHARD_WINDOW, Dealer, open_shard_window, shard_name
from batch_pipeline.core.manifest.dedup import BlockSpool, Dedup, Verdict
from batch_pipeline.core.manifest.generation import GENERATION_VERSION, GenerationCounts, GenerationRecord
from batch_pipeline.core.manifest.incremental import (
    FileAction,
    FilePlan,
    FileState,
    plan_files,
    state_after,
)
from batch_pipeline.core.manifest.index import IdIndex, index_path, index_writer
from batch_pipeline.core.manifest.prepare import (
    BUCKET_EDGES,
    REQUEST_FRAMING_BYTES,
    Block,
    FilePreparer,
    length_bucket,
    normalise_fields,
    render_expr,
)
from batch_pipeline.core.manifest.read import (
    ITEM_SCHEMA,
    REJECT_SCHEMA,
    ROW_SCHEMA,
    Manifest,
)
from batch_pipeline.core.manifest.rows import KEY, LINE, ReadExtent, Reject, file_chunks
from batch_pipeline.core.manifest.upstream import job_inputs
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import BackgroundWrites, Store

if TYPE_CHECKING:
    from batch_pipeline.core.manifest.parts import FileParts

__all__ = [
    "BUCKET_EDGES",
    "ITEM_SCHEMA",
    "REJECT_SCHEMA",
    "ROW_SCHEMA",
    "Manifest",
    "ManifestBuilder",
    "ManifestSummary",
    "ShardCaps",
    "build_manifest",
    "length_bucket",
    "normalise_fields",
    "render_expr",
    "shard_name",
]

log = logging.getLogger(__name__)

ROWS_PARQUET = {"use_dictionary": ["source"], "compression": "zstd", "compression_level": 1}  # benchmarks/README.md


class ManifestSummary(GenerationCounts):
    """What one build did: the generation's counts, and what it did with each input file."""

    # FileAction value -> URIs; the counts are of the rows read
    files: dict[str, list[str]] = Field(default_factory=lambda: {a.value: [] for a in FileAction})

    def as_dict(self) -> dict:
        return self.model_dump()

    def files_line(self) -> str:
        """``2 read, 5 skipped, 1 appended, 0 reread``: the summary's view of the input files."""
        return ", ".join(f"{len(self.files.get(a.value, []))} {a.value}" for a in FileAction)


DEAL_COLUMNS = ["request_id", "user_prompt", "est_input_tokens", "length_bucket", "request_bytes", LINE, "source"]


@dataclass(frozen=True)
class ShardCaps:
    """The tighter of the job's shard limits and the backend's own batch limits."""

    max_requests: int
    max_bytes: int

    @classmethod
    def of(
        cls, spec: JobSpec, backend_max_requests: int | None = None, backend_max_bytes: int | None = None
    ) -> "ShardCaps":
        return cls(
            min(spec.shards.max_requests, backend_max_requests or spec.shards.max_requests),
            min(spec.shards.max_bytes, backend_max_bytes or spec.shards.max_bytes),
        )


@dataclass
class _Intake:
    """What one build collects while it reads its files: the rejects, each file's state after the read, the
    rows spooled past the dedup's memory bound, and the bytes read so far (for the progress bar)."""

    summary: ManifestSummary
    preparer: FilePreparer
    read_meter: meters.Meter
    rejects: list[Reject] = field(default_factory=list)
    states: list[FileState] = field(default_factory=list)
    spool: BlockSpool | None = None
    files_done: int = 0  # bytes of the files read to their end

    def show_read(self, in_file: int = 0) -> None:
        """The bar at the files read so far and ``in_file`` bytes of the one being read."""
        self.read_meter.set(self.files_done + in_file)
        self.read_meter.describe(f"{self.summary.input_rows:,} rows")


def _take_dealt(summary: ManifestSummary, dealer: Dealer, verdict: Verdict) -> None:
    """The dealer's new items and shards into the summary; nothing is committed when the items dealt, the new
    IDs and the items written to shards disagree."""
    summary.new_requests = dealer.dealt
    summary.est_input_tokens_new = dealer.est_tokens
    summary.new_shards = sorted(dealer.new_shards)
    written = sum(dealer.written.values())
    if written != summary.new_requests or verdict.added != summary.new_requests:
        raise ReconciliationError(
            f"manifest {summary.job} gen {summary.generation}: {summary.new_requests} new items dealt, "
            f"{verdict.added} new IDs, {written} written to shards (nothing committed)"
        )


class ManifestBuilder:
    """One generation's build, with its options resolved (``build_manifest`` resolves the defaults)."""

    def __init__(
        self,
        spec: JobSpec,
        store: Store,
        caps: ShardCaps,
        dedup_budget: int,
        progress: Callable[[str, int], None] | None,
        parts: "FileParts | None",
    ):
        self.spec, self.store, self.paths = spec, store, JobPaths(spec.name)
        self.caps, self.dedup_budget = caps, dedup_budget
        self.progress, self.parts = progress, parts
        self.manifest = Manifest(spec.name, store)

    def build(self) -> ManifestSummary:
        """One generation: read what changed, deal its new items to new shards, then commit the record."""
        started = time.perf_counter()
        generations = self.manifest.generations()
        latest = max(generations, key=lambda g: g.generation) if generations else None
        gen = (latest.generation if latest else 0) + 1
        summary = ManifestSummary(job=self.spec.name, generation=gen)
        existing = latest.unique_requests if latest else 0
        files = job_inputs(self.spec, self.store)  # files, or another job's validated table (upstream.py)
        plans = plan_files(files, self.manifest.file_states(latest))
        summary.input_files = len(files)
        index = IdIndex(self.store, self.paths, {g.generation: g.new_shards for g in generations})
        index.ensure()
        preparer = FilePreparer(self.spec, self.caps.max_bytes)
        reading = [p for p in plans if p.reads]
        # the bytes this generation reads (a file's new part only): the bar's total, shown once reading starts
        read_meter = meters.meter("manifest", total=sum(max(p.file.size - p.offset, 0) for p in reading), unit="bytes")
        intake = _Intake(summary, preparer, read_meter)
        rows_ahead, bytes_ahead = _count_rows(reading, enough=OPEN_SHARD_WINDOW * self.caps.max_requests)
        window = open_shard_window(rows_ahead, bytes_ahead, self.caps.max_requests)
        first_shard = max((int(s[1:]) for g in generations for s in g.new_shards), default=0) + 1
        dedup = Dedup(index, existing, self.dedup_budget)
        try:
            dealer, verdict = self._read_and_deal(plans, intake, dedup, first_shard, window)
        finally:
            dedup.close()
            if intake.spool is not None:
                intake.spool.close()
        _take_dealt(summary, dealer, verdict)
        self._write_rejects(gen, intake.rejects)
        summary.rejected_rows = len(intake.rejects)
        for r in intake.rejects:
            summary.rejects_by_reason[r.kind] = summary.rejects_by_reason.get(r.kind, 0) + 1
        summary.unique_requests = existing + summary.new_requests
        # rows read that created no item: repeats within what was read, or of an item an earlier generation holds
        summary.duplicates_collapsed = summary.accepted_rows - summary.new_requests
        summary.known_requests = verdict.reused
        summary.shards_total = sum(len(g.new_shards) for g in generations) + len(summary.new_shards)
        summary.spilled = dedup.deferred_rows > 0  # rows were decided by hash range, past the memory bound
        summary.seconds = round(time.perf_counter() - started, 3)
        self._commit(summary, intake.states, dealer.totals(summary.new_shards))
        return summary

    def _read_and_deal(
        self, plans: list[FilePlan], intake: _Intake, dedup: Dedup, first_shard: int, window: int
    ) -> tuple[Dealer, Verdict]:
        """Read every file the plans read, write their rows and deal their new items to shards; the dedup's
        verdict once every row is in (the rows spooled past its memory bound are dealt then)."""
        gen = intake.summary.generation
        # row groups (in order, one thread) and shard files (two threads: when they fall behind, the main
        # thread waits and both cores compress) are written in the background: Parquet and zstd release the GIL
        with (
            self.store.parquet_writer(self.paths.rows(gen), ROW_SCHEMA, **ROWS_PARQUET) as rows_out,
            BackgroundWrites(depth=2) as row_writes,
            BackgroundWrites(depth=4, workers=2) as writes,
        ):
            dealer = Dealer(
                self.store,
                self.paths.shard_items,
                gen,
                first_shard,
                window,
                self.caps.max_requests,
                self.caps.max_bytes,
                REQUEST_FRAMING_BYTES + intake.preparer.system_bytes,
                writes,
            )
            write_rows = functools.partial(row_writes.submit, _write_rows, rows_out)
            for plan in plans:
                self._read_file(plan, intake, dedup, dealer, write_rows)
            with index_writer(self.store, index_path(self.paths, gen)) as emit:
                verdict = dedup.finish(emit)
            if intake.spool is not None:
                at = 0
                for frame in intake.spool.replay():
                    dealer.deal(frame, verdict.is_new[at : at + frame.height])
                    at += frame.height
            dealer.close()
        return dealer, verdict

    def _read_file(
        self,
        plan: FilePlan,
        intake: _Intake,
        dedup: Dedup,
        dealer: Dealer,
        write_rows: Callable[[pl.DataFrame, str], object],
    ) -> None:
        """One input file as its plan says: skipped, or read block by block into rows, rejects and dealt items."""
        summary = intake.summary
        summary.files[plan.action.value].append(plan.file.uri)
        if not plan.reads:
            intake.states.append(state_after(plan, summary.generation, 0, 0, False))
            return
        f, extent = plan.file, ReadExtent()
        for block in self._blocks(intake.preparer, plan, extent):
            summary.input_rows += block.rows_in
            intake.rejects.extend(block.rejects)
            frame = block.frame
            if frame.height == 0:
                continue
            write_rows(frame.select(LINE, KEY, "request_id"), block.source)
            summary.accepted_rows += frame.height
            keep = dedup.offer(block.ids())
            if keep is None:  # past the memory bound: decided once every row is in
                intake.spool = intake.spool or BlockSpool()
                intake.spool.append(frame.select(DEAL_COLUMNS))
            else:
                dealer.deal(frame.select(DEAL_COLUMNS), np.asarray(keep, dtype=np.bool_))
            if self.progress:
                self.progress(f.uri, summary.input_rows)
            intake.show_read(min(max(extent.bytes_read - plan.offset, 0), f.size - plan.offset))
        intake.files_done += max(f.size - plan.offset, 0)
        intake.show_read()
        intake.states.append(state_after(plan, summary.generation, extent.bytes_read, extent.lines, extent.ends_clean))

    def _commit(self, summary: ManifestSummary, states: list[FileState], totals: dict[str, list[int]]) -> None:
        """Write the generation record, the build's commit point, with each input file's state after it and each
        new shard's totals (items, est_input_tokens)."""
        record = GenerationRecord.model_validate(
            {**summary.as_dict(), "files": states, "shard_totals": totals, "version": GENERATION_VERSION}
        )
        self.store.write_json(self.paths.generation(summary.generation), record.as_json())
        log.info(
            "manifest %s gen %d: %d files (%s), %d rows, %d rejected, %d new requests in %d new shards (%.1fs)",
            summary.job,
            summary.generation,
            summary.input_files,
            summary.files_line(),
            summary.input_rows,
            summary.rejected_rows,
            summary.new_requests,
            len(summary.new_shards),
            summary.seconds,
        )

    def _blocks(self, preparer: FilePreparer, plan: FilePlan, extent: ReadExtent) -> Iterator[Block]:
        """The file's prepared blocks: from a part prepared on its own for this plan, or read here."""
        part = self.parts.ready(plan) if self.parts is not None else None
        return part.blocks(extent) if part is not None else preparer.blocks(plan, extent)

    def _write_rejects(self, gen: int, rejects: list[Reject]) -> None:
        cols = {name: [getattr(r, name) for r in rejects] for name in REJECT_SCHEMA.names}
        # built by Polars: pyarrow's list conversion imports pandas (~0.4 s)
        table = pl.DataFrame(cols, schema={f.name: pl.Int64 if f.name == "line" else pl.String for f in REJECT_SCHEMA})
        self.store.write_table(self.paths.rejects(gen), table.to_arrow().cast(REJECT_SCHEMA))


def _write_rows(writer, frame: pl.DataFrame, source: str) -> None:
    writer.write_table(
        frame.select(
            pl.lit(source).alias("source"), pl.col(LINE).alias("line"), pl.col(KEY).alias("source_key"), "request_id"
        )
        .to_arrow()
        .cast(ROW_SCHEMA)
    )


def _count_rows(plans: list[FilePlan], enough: int | None = None) -> tuple[int, int]:
    """A cheap upper bound of the rows to come (from each plan's offset), and the bytes those counted take, to size
    the window of open shards (``deal.open_shard_window``).

    Counting stops once ``enough`` rows are seen: past that the window is full whatever the total, so only the
    head of a large input is read. A Parquet file's bytes are its row groups' uncompressed sizes.
    """
    total = size = 0
    for plan in plans:
        f = plan.file
        if enough is not None and total >= enough:
            break
        if f.format == "parquet":
            import pyarrow.parquet as pq

            with f.fs.open_input_file(f.path) as h:
                meta = pq.ParquetFile(h).metadata
                total += meta.num_rows
                size += sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
        else:
            for chunk, _ in file_chunks(f, plan.offset):
                total += chunk.count(b"\n")
                size += len(chunk)
                if enough is not None and total >= enough:
                    break
    return total, size


def build_manifest(
    spec: JobSpec,
    store: Store,
    progress: Callable[[str, int], None] | None = None,
    caps: ShardCaps | None = None,
    dedup_budget_bytes: int | None = None,
    parts: "FileParts | None" = None,
) -> ManifestSummary:
    """Build the job's next manifest generation. ``parts``: files prepared on their own
    (``parts.prepare_file_part``), used instead of reading them. ``dedup_budget_bytes``: the memory the dedup sets
    may take before they spill (default: half of ``shards.manifest_memory_mb``; the rest is for the blocks in
    flight and the open shards)."""
    budget = dedup_budget_bytes if dedup_budget_bytes is not None else spec.shards.manifest_memory_mb * 2**20 // 2
    return ManifestBuilder(spec, store, caps or ShardCaps.of(spec), budget, progress, parts).build()
