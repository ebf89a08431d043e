"""One pass over a job's store, a group of shards at a time: the figures a report, the dead letters and the
reconciliation need, without every result row in memory at once.

A request lives in one shard, so everything per item (its state, its first attempt's cost) is exact within a
group; the job's figures are sums over groups. Memory follows the group (``group_items`` items and their
results), not the job. The one job-wide set is a 64-bit hash per item (8 bytes each: 80 MB at 10M items), which
shows a request ID that appears in two shards.
"""

import io
import logging
import threading
from dataclasses import dataclass, field

import polars as pl

from batch_pipeline.core.errors import ReconciliationError
from batch_pipeline.core.ledger.reconcile import DEAD, Counts, check_invariant, counts_by_shard, item_states
from batch_pipeline.core.ledger.replay import Replays
from batch_pipeline.core.ledger.result_parts import read_parts, result_parts
from batch_pipeline.core.manifest.shards import Manifest
from batch_pipeline.core.quality.golden import GoldenProbes
from batch_pipeline.core.quality.shard_stats import STATS_COLUMNS, ShardAggregates, outliers
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store

log = logging.getLogger(__name__)

# items (and their results) read together; the frames follow it: the scan of a 10M-item job peaked at 1.74 GB RSS
# with groups of 500k items (benchmarks/README.md, "Publishing at scale")
GROUP_ITEMS = 250_000
SCAN_COLUMNS = [
    "request_id",
    "attempt",
    "shard_id",
    "status",
    "parsed_output",
    "error_class",
    "error_code",
    "error_message",
    "pricing",
    "cost_usd",
    "input_tokens",
    "cached_tokens",
    "output_tokens",
    "recorded_at",
]
DEAD_LETTER_COLUMNS = ["request_id", "shard_id", "failures", "attempts", "last_status", "last_error_code", "last_error"]


@dataclass
class JobScan:
    """What one pass over the job found (figures of the job's items; golden probe rows kept apart)."""

    per_shard: dict[str, Counts] = field(default_factory=dict)
    requests_sent: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    first_try_cost_usd: float = 0.0  # each request's first attempt; the rest is retry spend
    cost_by_pricing: dict[str, float] = field(default_factory=dict)
    cost_by_attempt: dict[int, float] = field(default_factory=dict)
    timeline: pl.DataFrame = field(
        default_factory=lambda: pl.DataFrame(
            schema={"recorded_at": pl.Datetime("us", "UTC"), "cost_usd": pl.Float64, "accepted": pl.Int64}
        )
    )
    dead_letters: pl.DataFrame = field(
        default_factory=lambda: pl.DataFrame(
            schema={
                "request_id": pl.String,
                "shard_id": pl.String,
                "failures": pl.UInt32,
                "attempts": pl.Int32,
                "last_status": pl.String,
                "last_error_code": pl.String,
                "last_error": pl.String,
            }
        )
    )
    probe_results: pl.DataFrame | None = None
    problems: list[str] = field(default_factory=list)  # reconciliation gaps, raised by ``check``
    groups: int = 0

    @property
    def retry_cost_usd(self) -> float:
        return self.cost_usd - self.first_try_cost_usd

    def check(self) -> Counts:
        """The invariant of every group and across them; ``ReconciliationError`` naming the gaps."""
        if self.problems:
            raise ReconciliationError("reconciliation failed: " + "; ".join(self.problems))
        return self.totals

    @property
    def totals(self) -> Counts:
        return Counts(
            *(
                sum(getattr(c, f) for c in self.per_shard.values())
                for f in ("expected", "valid", "invalid", "missing", "dead_lettered")
            )
        )


def scan_job(spec: JobSpec, store: Store, group_items: int = GROUP_ITEMS) -> JobScan:
    """Read the job a group of shards at a time (about ``group_items`` items each) and sum what the report,
    dead letters and reconciliation need."""
    manifest = Manifest(spec.name, store)
    shard_ids = manifest.shard_ids()
    parts = result_parts(store, spec.name)
    replays = Replays(store, spec.name).table()
    probe_ids = GoldenProbes(spec, store).all_probe_ids().select("request_id") if spec.quality is not None else None
    out = JobScan()
    hashes: list[pl.Series] = []
    probe_frames: list[pl.DataFrame] = []
    dead: list[pl.DataFrame] = [out.dead_letters]
    times: list[pl.DataFrame] = []
    for group in _groups(manifest, shard_ids, group_items):
        out.groups += 1
        items = _items(manifest, group)
        results = read_parts(store, [rel for sid in group for rel in parts.get(sid, [])], SCAN_COLUMNS)
        if probe_ids is not None and probe_ids.height and results.height:
            probe_frames.append(results.join(probe_ids, on="request_id", how="semi"))
            results = results.join(probe_ids, on="request_id", how="anti")
        group_replays = replays.filter(pl.col("shard_id").is_in(group)) if replays.height else None
        states = item_states(items, results, spec.retries, group_replays)
        try:
            check_invariant(items, results, states)
        except ReconciliationError as exc:
            out.problems.append(f"shards {group[0]}..{group[-1]}: {exc}")
        hashes.append(items.get_column("request_id").hash())
        out.per_shard.update(counts_by_shard(states))
        for sid in group:  # a shard with no items (none today) still has a row
            out.per_shard.setdefault(sid, Counts(0, 0, 0, 0, 0))
        dead.append(_detached(states.filter(pl.col("state") == DEAD).select(DEAD_LETTER_COLUMNS)))
        _add_results(out, results)
        times.append(_timeline(results))
    _orphan_shards(out, store, spec, parts, set(shard_ids), probe_ids)
    if hashes:
        all_hashes = pl.concat(hashes)
        if all_hashes.n_unique() != all_hashes.len():
            out.problems.append(
                f"{all_hashes.len() - all_hashes.n_unique()} request IDs appear in more than one shard (by hash)"
            )
    out.dead_letters = pl.concat(dead, how="vertical_relaxed")
    if times:
        out.timeline = _timeline_merge(pl.concat(times))
    if probe_ids is not None:
        out.probe_results = pl.concat(probe_frames) if probe_frames else read_parts(store, [], SCAN_COLUMNS)
    return out


def scanned(spec: JobSpec, store: Store, group_items: int = GROUP_ITEMS) -> JobScan:
    """``scan_job``, once per set of inputs in a process. A publish asks for the same pass four times (the staged
    table's dead letters, the reconciliation check, the dead letters, the report), one step after another; in one
    process (the CLI's run, a run worker) the later steps get the pass the first one made, as long as nothing it
    read has changed: the spec, and every file under the result parts, the manifest, the replays and the golden
    probes (name, size and mtime, from one listing each). A part written since, or a file rewritten, is a new pass.
    The scan returned is shared: its readers do not change it."""
    global _last_scan
    key = _scan_inputs(spec, store, group_items)  # before the pass: a part written during it is a change
    with _last_scan_lock:
        last = _last_scan
    if last is not None and last[0] == key:
        return last[1]
    scan = scan_job(spec, store, group_items)
    with _last_scan_lock:
        _last_scan = (key, scan)
    return scan


_last_scan: tuple[tuple, JobScan] | None = None
_last_scan_lock = threading.Lock()


def _scan_inputs(spec: JobSpec, store: Store, group_items: int) -> tuple:
    """What ``scan_job`` reads, as listed (10M items: ~32,000 files, one listing per folder)."""
    paths = JobPaths(spec.name)
    folders = (paths.results, f"{paths.root}/manifest", paths.replays, f"{paths.root}/golden/probes")
    return (
        store.uri(paths.root),
        spec.model_dump_json(),
        group_items,
        *(tuple(store.file_stats(rel)) for rel in folders),
    )


def job_shard_outliers(spec: JobSpec, store: Store, group_items: int = GROUP_ITEMS) -> pl.DataFrame:
    """``shard_stats.outliers`` of the job's shards, read a group of shards at a time (memory follows the group:
    each group is summed per shard before the next is read)."""
    manifest = Manifest(spec.name, store)
    parts = result_parts(store, spec.name)
    aggregates = [
        ShardAggregates.of(read_parts(store, [rel for sid in group for rel in parts.get(sid, [])], STATS_COLUMNS))
        for group in _groups(manifest, manifest.shard_ids(), group_items)
    ]
    return outliers(ShardAggregates.stacked(aggregates), spec.output.kind)


def _detached(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` in buffers of its own. A filtered string column still points into the whole group's buffers
    (read by pyarrow, zero-copy), so the few dead letters of each group kept every group's results alive:
    652 MB after a 10M-item scan, freed on their own. Written out through Arrow IPC, they own their bytes."""
    sink = io.BytesIO()
    frame.write_ipc(sink, compression="uncompressed")
    return pl.read_ipc(io.BytesIO(sink.getvalue()))


def _groups(manifest: Manifest, shard_ids: list[str], group_items: int) -> list[list[str]]:
    """Consecutive shards of about ``group_items`` items together (the shard size from the latest generation)."""
    latest = manifest.latest()
    per_shard = max(1, (latest.unique_requests if latest else 1) // max(1, len(shard_ids)))
    size = max(1, group_items // per_shard)
    return [shard_ids[i : i + size] for i in range(0, len(shard_ids), size)]


def _items(manifest: Manifest, group: list[str]) -> pl.DataFrame:
    frames = [pl.from_arrow(manifest.shard_items(sid, ["request_id", "shard_id"])) for sid in group]
    return pl.concat(frames)  # type: ignore[arg-type]


def _add_results(out: JobScan, results: pl.DataFrame) -> None:
    if not results.height:
        return
    sums = results.select(
        pl.len().alias("n"),
        pl.col("input_tokens").sum(),
        pl.col("cached_tokens").sum(),
        pl.col("output_tokens").sum(),
        pl.col("cost_usd").sum(),
    ).row(0, named=True)
    out.requests_sent += sums["n"]
    out.input_tokens += int(sums["input_tokens"] or 0)
    out.cached_tokens += int(sums["cached_tokens"] or 0)
    out.output_tokens += int(sums["output_tokens"] or 0)
    out.cost_usd += float(sums["cost_usd"] or 0.0)
    first = results.filter(pl.col("attempt") == pl.col("attempt").min().over("request_id"))
    out.first_try_cost_usd += float(first["cost_usd"].sum() or 0.0)
    for key, cost in results.group_by("pricing").agg(pl.col("cost_usd").sum()).iter_rows():
        out.cost_by_pricing[key] = out.cost_by_pricing.get(key, 0.0) + cost
    for key, cost in results.group_by("attempt").agg(pl.col("cost_usd").sum()).iter_rows():
        out.cost_by_attempt[key] = out.cost_by_attempt.get(key, 0.0) + cost


def _timeline(results: pl.DataFrame) -> pl.DataFrame:
    """Cost and accepted items per recording time (one time per part written: thousands of rows, not millions)."""
    return results.group_by("recorded_at").agg(
        pl.col("cost_usd").sum(), (pl.col("status") == "succeeded").sum().cast(pl.Int64).alias("accepted")
    )


def _timeline_merge(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.group_by("recorded_at").agg(pl.col("cost_usd").sum(), pl.col("accepted").sum()).sort("recorded_at")


def _orphan_shards(
    out: JobScan,
    store: Store,
    spec: JobSpec,
    parts: dict[str, list[str]],
    known: set[str],
    probe_ids: pl.DataFrame | None,
) -> None:
    """Results stored under a shard the manifest does not have: every such row is for an unknown item."""
    for sid in sorted(set(parts) - known):
        rows = read_parts(store, parts[sid], ["request_id", "attempt"])
        if probe_ids is not None and probe_ids.height:
            rows = rows.join(probe_ids, on="request_id", how="anti")
        if rows.height:
            out.problems.append(
                f"{rows['request_id'].n_unique()} results for request IDs the manifest does not "
                f"know, under shard {sid} (e.g. {rows['request_id'][0]})"
            )
