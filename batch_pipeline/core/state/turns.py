"""What a loop that carries out the driver's plan may do per turn, decided here once for both loops (the CLI's
passes, ``defs/pipeline.py``; the shard sensor's ticks, ``defs/sensors.py``): which run carries each action, how
often a kind of turn may repeat before the loop stops and says why, how many runs and polls one sensor tick makes,
and when a shard whose runs keep failing waits for a human."""

from dataclasses import dataclass
from enum import StrEnum

from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.state.driver import Action


class RunStage(StrEnum):
    """The runs (Dagster jobs) that carry the driver's steps."""

    QUOTE = "quote"
    SUBMIT = "submit"
    COLLECT = "collect"
    PUBLISH = "publish"


# the one map from the driver's actions to the run that carries them
STAGE_OF: dict[Action, RunStage] = {
    Action.CANARY: RunStage.SUBMIT,
    Action.SUBMIT: RunStage.SUBMIT,
    Action.RESOLVE: RunStage.SUBMIT,
    Action.RESCUE: RunStage.SUBMIT,
    Action.COLLECT: RunStage.COLLECT,
    Action.REQUOTE: RunStage.QUOTE,
    Action.PUBLISH: RunStage.PUBLISH,
}
# the steps that send items (the canary apart: it runs alone, before anything else is sent)
SENDS: tuple[Action, ...] = tuple(a for a, s in STAGE_OF.items() if s == RunStage.SUBMIT and a != Action.CANARY)
# what a pass of the CLI moves: what it sends and what it collects
MOVES: tuple[Action, ...] = (*SENDS, Action.COLLECT)


@dataclass(frozen=True)
class TurnLimits:
    """How often each kind of turn may repeat, and what one sensor tick may ask for."""

    passes: int  # CLI passes over the shards (expired and cancelled items do not spend their budget: +2)
    canaries: int  # canary attempts without a verdict
    requotes: int = 3  # re-quotes in a row that leave the quote stale
    idle_queue_turns: int = 5  # turns with every account queue empty and still nothing admitted
    runs_per_tick: int = 40  # shard runs one sensor tick requests; the rest on the next ticks
    polls_per_tick: int = 200  # provider polls per tick (the longest-waiting batches first)
    failed_runs: int = 3  # runs of one step failed in a row before the shard waits for a human

    @classmethod
    def for_spec(cls, spec: JobSpec) -> "TurnLimits":
        return cls(passes=spec.retries.per_item + 2, canaries=spec.retries.per_item + 1)

    def stuck(self, failures: int) -> bool:
        """A shard whose run of the same step failed this often is not asked for again: it waits for a human."""
        return failures >= self.failed_runs

    def stuck_reason(self, shards: list[str]) -> str:
        return f"shard(s) {', '.join(shards)} failed {self.failed_runs} runs in a row: look at their runs"

    def too_many_requotes(self, requotes: int, plan: str) -> str | None:
        if requotes <= self.requotes:
            return None
        return f"the quote stays stale after {requotes - 1} re-quotes: {plan}"

    def too_many_canaries(self, canaries: int, shard: str, plan: str) -> str | None:
        if canaries <= self.canaries:
            return None
        return f"the canary shard {shard} got no verdict after {canaries - 1} attempts: {plan}"

    def queue_never_fits(self, idle_turns: int, job: str, plan: str) -> str | None:
        if idle_turns <= self.idle_queue_turns:
            return None
        return (
            f"job {job}: nothing it sends fits the account's queue even when the queue is empty: {plan}; "
            "raise backend.settings.quota (or lower shards.max_requests) and run again"
        )
