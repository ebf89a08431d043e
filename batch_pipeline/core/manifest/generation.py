"""A manifest generation as it is stored (``JobPaths.generation``) and read back: a typed record.

``ManifestBuilder.build`` writes one per manifest run, as its commit point: the run's counts (``GenerationCounts``,
which its ``ManifestSummary`` holds too) and each current input file as the run left it (``FileState``).
``Manifest`` reads them to list the shards, find the live rows and number the next generation; the report and the
retry cap read the latest one's counts.

Versions: 1 is the shape written before the record was typed (no ``version`` key) and since; generations older
than incremental builds have no ``files`` (their own parts hold every row). 2 adds ``shard_totals``: each new
shard's item count and the sum of its items' ``est_input_tokens`` (what the quote and the budget guard add up
instead of reading every item); a version-1 generation has none, and ``Manifest.shard_totals`` computes them from
its shard files (one column read per shard) when asked. Unknown keys are ignored
(``extra="ignore"``): a generation is written once and never rewritten, so a newer release's extra counts are
never lost, and an older release can still read the shards a newer one dealt.
"""

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from batch_pipeline.core.manifest.incremental import FileState

GENERATION_VERSION = 2


class GenerationCounts(BaseModel):
    """The counts of one manifest generation: what the build read and dealt (``ManifestSummary``), and what its
    record keeps of it (``GenerationRecord``)."""

    job: str
    generation: int
    input_files: int = 0
    input_rows: int = 0
    rejected_rows: int = 0
    accepted_rows: int = 0
    unique_requests: int = 0  # the job's items after this generation
    new_requests: int = 0
    duplicates_collapsed: int = 0  # accepted rows read that made no new item
    known_requests: int = 0  # distinct IDs read that an earlier generation already holds
    shards_total: int = 0
    new_shards: list[str] = Field(default_factory=list)
    est_input_tokens_new: int = 0
    seconds: float = 0.0
    rejects_by_reason: dict[str, int] = Field(default_factory=dict)
    spilled: bool = False  # the dedup went past its memory bound and decided by hash range


class ShardTotals(BaseModel):
    """Per new shard of a generation, in ``new_shards`` order: its items and the sum of their ``est_input_tokens``
    (as the shard file holds them; a shard's membership never changes, so neither do they)."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    items: list[int]
    est_input_tokens: list[int]

    @model_validator(mode="after")
    def _aligned(self) -> "ShardTotals":
        if len(self.items) != len(self.est_input_tokens):
            raise ValueError("shard_totals: items and est_input_tokens differ in length")
        return self


class GenerationRecord(GenerationCounts):
    """One committed manifest generation: what it read, what it dealt, and each input file's state after it."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    version: int = 1  # a record without the key is a version-1 one; the builder writes GENERATION_VERSION
    files: list[FileState] = Field(default_factory=list)  # none before incremental builds
    shard_totals: ShardTotals | None = None  # none before version 2

    @model_validator(mode="after")
    def _totals_per_new_shard(self) -> "GenerationRecord":
        if self.shard_totals is not None and len(self.shard_totals.items) != len(self.new_shards):
            raise ValueError(
                f"generation {self.generation}: shard_totals has {len(self.shard_totals.items)} shards, "
                f"new_shards {len(self.new_shards)}"
            )
        return self

    def totals(self) -> dict[str, tuple[int, int]] | None:
        """Each new shard -> (items, sum of est_input_tokens); None for a generation written without them."""
        if self.shard_totals is None:
            return None
        t = self.shard_totals
        return dict(zip(self.new_shards, zip(t.items, t.est_input_tokens, strict=True), strict=True))

    @field_validator("files", mode="before")
    @classmethod
    def _file_states(cls, value: Any) -> Any:
        """A record made straight from ``ManifestSummary.as_dict`` holds the summary's action -> URIs map here,
        not file states: it has none (its own parts hold every row, as before incremental builds)."""
        return [] if isinstance(value, dict) else value

    def as_json(self) -> dict:
        return self.model_dump(mode="json")
