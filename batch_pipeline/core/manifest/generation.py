"""A manifest generation as it is stored (``JobPaths.generation``) and read back: a typed record.

``ManifestBuilder.build`` writes one per manifest run, as its commit point: the run's counts (``GenerationCounts``,
which its ``ManifestSummary`` holds too) and each current input file as the run left it (``FileState``).
``Manifest`` reads them to list the shards, find the live rows and number the next generation; the report and the
retry cap read the latest one's counts.

Versions: 1 is the shape written before the record was typed (no ``version`` key) and since; generations older
than incremental builds have no ``files`` (their own parts hold every row). Unknown keys are ignored
(``extra="ignore"``): a generation is written once and never rewritten, so a newer release's extra counts are
never lost, and an older release can still read the shards a newer one dealt.
"""

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from batch_pipeline.core.manifest.incremental import FileState

GENERATION_VERSION = 1


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


class GenerationRecord(GenerationCounts):
    """One committed manifest generation: what it read, what it dealt, and each input file's state after it."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    version: int = GENERATION_VERSION
    files: list[FileState] = Field(default_factory=list)  # none before incremental builds

    @field_validator("files", mode="before")
    @classmethod
    def _file_states(cls, value: Any) -> Any:
        """A record made straight from ``ManifestSummary.as_dict`` holds the summary's action -> URIs map here,
        not file states: it has none (its own parts hold every row, as before incremental builds)."""
        return [] if isinstance(value, dict) else value

    def as_json(self) -> dict:
        return self.model_dump(mode="json")
