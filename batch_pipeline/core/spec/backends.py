"""The pieces of a job spec that say where requests go: a backend, and the backends a job can choose between
(the tail rescue, the fallback model, the router's candidates, the cost comparison). Every model rejects
unknown keys."""

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Strict(BaseModel):
    """Unknown keys are errors; a parsed spec is immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class BackendSpec(Strict):
    name: str = Field(description="a registered executor: openai_batch, ...")
    settings: dict[str, Any] = Field(default_factory=dict)


class TailRescueSpec(Strict):
    """Near the deadline, or when a batch expires, unfinished items go to an online backend (interactive price)."""

    backend: BackendSpec = Field(default_factory=lambda: BackendSpec(name="online"))
    before_deadline_minutes: float = Field(default=60, ge=0)
    on_expiry: bool = True


class SelfHostedCost(Strict):
    gpu_usd_per_hour: float = Field(gt=0)
    gpus: int = Field(default=1, ge=1)
    prefill_tokens_per_s: float = Field(gt=0, description="measured, aggregate over the batch")
    decode_tokens_per_s: float = Field(gt=0, description="measured, aggregate over the batch")
    prefix_hit_share: float = Field(default=0.0, ge=0, lt=1)
    utilisation: float = Field(default=0.7, gt=0, le=1)
    spot_loss: float = Field(default=0.0, ge=0, lt=1, description="share of GPU time lost to preemption")


class BackendChoice(Strict):
    backend: BackendSpec
    model: str | None = None


class CostCompareSpec(Strict):
    backends: list[BackendChoice] = Field(default_factory=list)
    self_hosted: SelfHostedCost | None = None


class FallbackSpec(Strict):
    """A second model for the items the primary could not answer: those whose retry budget is spent and those that
    hit a non-retryable model error (poison). Systemic errors never fall back: they stop the job."""

    model: str = Field(min_length=1)
    backend: BackendSpec | None = Field(default=None, description="default: the job's backend")


class RouteCandidate(Strict):
    """One backend the router may send a shard to, with the model it answers with there."""

    backend: BackendSpec
    model: str | None = Field(default=None, description="default: the job's model")


class RouteSpec(Strict):
    """``backend: auto``: the router (core/route/) picks one candidate per shard before it is submitted."""

    candidates: list[RouteCandidate] = Field(min_length=1)
    data_may_leave: bool = Field(default=True, description="false: self-hosted candidates only")
    min_batch_items: int = Field(default=50, ge=0, description="a shard sending fewer items goes online")
    online: RouteCandidate = Field(
        default_factory=lambda: RouteCandidate(backend=BackendSpec(name="online")),
        description="where a shard below min_batch_items goes",
    )
