"""Dead-letter replay: after a fix, give matching dead letters a fresh budget.

A replay may grant a larger ``max_tokens`` to the shards it reopens (``--max-tokens``): the answers that fit
the old limit stay valid (a limit only cuts an answer short; it does not change it), so the request IDs and
every finished result are kept, and only the truncated items are sent again with room to finish. Editing
``sampling.max_tokens`` in the spec instead makes a new request fingerprint: a new version of the whole job.

Each replay is an immutable record (``replays/replay-0001.parquet`` with the items and the attempt they had
reached, plus a ``.json`` with what and when); the failures before it stop counting for those items, so the driver
sees them as retryable again and the next pass sends them once more.
"""

from dataclasses import asdict, dataclass
from datetime import UTC, datetime

import polars as pl

from batch_pipeline.core.spec.paths import JobPaths
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
    max_tokens: int | None = None  # the fix: later attempts of these shards may answer at this length

    def as_dict(self) -> dict:
        return asdict(self)


class Replays:
    def __init__(self, store: Store, job: str):
        self.store, self.paths = store, JobPaths(job)

    def table(self, shard_id: str | None = None) -> pl.DataFrame:
        """Every replayed item (request_id, shard_id, through_attempt), optionally of one shard."""
        parts = [
            self.store.read_part(p, REPLAY_COLUMNS)
            for p in self.store.list_files(self.paths.replays, suffix=".parquet")
        ]
        frames = [pl.from_arrow(t) for t in parts if t is not None and t.num_rows]
        if not frames:
            return pl.DataFrame(schema={"request_id": pl.String, "shard_id": pl.String, "through_attempt": pl.Int32})
        table = pl.concat(frames)  # type: ignore[arg-type]
        return table.filter(pl.col("shard_id") == shard_id) if shard_id is not None else table

    def records(self) -> list[ReplayRecord]:
        out = [self.store.read_json(p) for p in self.store.list_files(self.paths.replays, suffix=".json")]
        return [ReplayRecord(**r) for r in out if r]

    def max_tokens(self, shard_id: str) -> int | None:
        """The largest ``max_tokens`` a replay granted this shard, if any."""
        granted = [r.max_tokens for r in self.records() if r.max_tokens and shard_id in r.shards]
        return max(granted) if granted else None

    def record(
        self, dead: pl.DataFrame, code: str | None, kind: str | None, max_tokens: int | None = None
    ) -> ReplayRecord:
        """Write one replay of the given dead letters (request_id, shard_id, attempts)."""
        number = len(self.records()) + 1
        rel = f"{self.paths.replays}/replay-{number:04d}"
        table = dead.select("request_id", "shard_id", pl.col("attempts").cast(pl.Int32).alias("through_attempt"))
        self.store.write_table(f"{rel}.parquet", table.to_arrow())
        rec = ReplayRecord(
            number,
            datetime.now(UTC).isoformat(),
            code,
            kind,
            dead.height,
            sorted(dead["shard_id"].unique().to_list()),
            max_tokens,
        )
        self.store.write_json(f"{rel}.json", rec.as_dict())
        return rec


def select_dead_letters(dead: pl.DataFrame, code: str | None = None, kind: str | None = None) -> pl.DataFrame:
    """Dead letters matching an error code (e.g. ``truncated``) and/or an error class (e.g. ``invalid_output``)."""
    if code is not None:
        dead = dead.filter(pl.col("last_error_code") == code)
    if kind is not None:
        dead = dead.filter(pl.col("last_error_class") == kind)
    return dead
