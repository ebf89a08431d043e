"""What a submission and a collection report back to their caller."""

from dataclasses import dataclass, field

from batch_pipeline.core.ledger.executor import BatchHandle


@dataclass
class SubmitOutcome:
    shard_id: str
    attempt: int | None
    requests: int
    handle: BatchHandle | None
    reattached: bool = False
    refused: str | None = None  # the provider refused the create for capacity (nothing billed): why

    @property
    def nothing_to_do(self) -> bool:
        return self.handle is None


@dataclass
class CollectOutcome:
    shard_id: str
    attempts: list[int] = field(default_factory=list)
    rows: int = 0
    succeeded: int = 0
    final_states: list[str] = field(default_factory=list)
