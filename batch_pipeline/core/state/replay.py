"""Dead-letter replay: after a fix (a larger ``max_tokens``, a repaired prompt), give matching dead letters a
fresh budget. Each replay is an immutable record (``replays/replay-0001.parquet`` with the items and the attempt
they had reached, plus a ``.json`` with who/what/when); the failures before it stop counting for those items, so
the driver sees them as retryable again and the next pass sends them once more.
"""

from dataclasses import asdict, dataclass
from datetime import UTC, datetime

import polars as pl

from batch_pipeline.core.paths import JobPaths
from batch_pipeline.core.store import Store

REPLAY_COLUMNS = ["request_id", "shard_id", "through_attempt"]


@dataclass(frozen=True)
class ReplayRecord:
    number: int
    at: str
    code: str | None
    kind: str | None
    items: int
    shards: list[str]

    def as_dict(self) -> dict:
        return asdict(self)


class Replays:
    def __init__(self, store: Store, job: str):
        self.store, self.paths = store, JobPaths(job)

    def table(self, shard_id: str | None = None) -> pl.DataFrame:
        """Every replayed item (request_id, shard_id, through_attempt), optionally of one shard."""
        parts = [self.store.read_part(p, REPLAY_COLUMNS)
                 for p in self.store.list_files(self.paths.replays, suffix=".parquet")]
        frames = [pl.from_arrow(t) for t in parts if t is not None and t.num_rows]
        if not frames:
            return pl.DataFrame(schema={"request_id": pl.String, "shard_id": pl.String, "through_attempt": pl.Int32})
        table = pl.concat(frames)  # type: ignore[arg-type]
        return table.filter(pl.col("shard_id") == shard_id) if shard_id is not None else table

    def records(self) -> list[ReplayRecord]:
        out = [self.store.read_json(p) for p in self.store.list_files(self.paths.replays, suffix=".json")]
        return [ReplayRecord(**r) for r in out if r]

    def record(self, dead: pl.DataFrame, code: str | None, kind: str | None) -> ReplayRecord:
        """Write one replay of the given dead letters (request_id, shard_id, attempts)."""
        number = len(self.records()) + 1
        rel = f"{self.paths.replays}/replay-{number:04d}"
        table = dead.select("request_id", "shard_id", pl.col("attempts").cast(pl.Int32).alias("through_attempt"))
        self.store.write_table(f"{rel}.parquet", table.to_arrow())
        rec = ReplayRecord(number, datetime.now(UTC).isoformat(), code, kind, dead.height,
                           sorted(dead["shard_id"].unique().to_list()))
        self.store.write_json(f"{rel}.json", rec.as_dict())
        return rec


def select_dead_letters(dead: pl.DataFrame, code: str | None = None, kind: str | None = None) -> pl.DataFrame:
    """Dead letters matching an error code (e.g. ``truncated``) and/or an error class (e.g. ``invalid_output``)."""
    if code is not None:
        dead = dead.filter(pl.col("last_error_code") == code)
    if kind is not None:
        dead = dead.filter(pl.col("last_error_class") == kind)
    return dead
