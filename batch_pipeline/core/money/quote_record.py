"""The quote as it is stored (``JobPaths.quote`` and ``quotes/quote-<at>.json``) and read back: a typed record.

``plain_quote`` and ``extended_quote`` build it, the quote asset and ``batch-pipeline quote`` write and show it
(``model_dump(mode="json")``: the same JSON as the dict it replaces, plus ``version``), and the budget guard, the
admission of a batch, the driver's freshness rule, a later pass's cascade and the report read its attributes.

Versions: 1 is the shape written before the record was typed (no ``version`` key: read as 1) and since. A change
of shape bumps ``QUOTE_VERSION`` and reads the older ones here. Unknown keys are ignored rather than refused
(``extra="ignore"``): a quote written by a newer release still reads in an older one, and the quote is
re-made (never edited in place) before anything is spent on it, so nothing unknown is lost by a rewrite.
"""

import logging
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from batch_pipeline.core.money.estimate import RequestTokens
from batch_pipeline.core.pricing.cost import Price
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store

log = logging.getLogger(__name__)

QUOTE_VERSION = 1


def _absent(value: object) -> bool:
    return value is None


class QuotePart(BaseModel):
    """A part of a stored quote: unknown keys (a newer writer's) are ignored."""

    model_config = ConfigDict(extra="ignore")


class Levels(QuotePart):
    """One figure at three cache-hit levels, or a dollar range: low, expected, high."""

    low: float
    expected: float
    high: float


class PassCost(QuotePart):
    """One pass of requests (the first pass, the golden probes): tokens and cost, low to high."""

    requests: int
    input_tokens: int
    output_tokens_expected: int
    output_tokens_max: int
    cost_low: float
    cost_expected: float
    cost_high: float


class ProbePass(PassCost):
    shards: int  # the shards whose next submission the probes ride in


class RetryPass(QuotePart):
    expected_share: float  # of the items, retried once
    cost_expected: float
    cost_high: float  # the retry-spend cap


class FallbackPass(QuotePart):
    """The fallback model's allowance: its quote of the pending items times the share expected to reach it."""

    model: str
    backend: str
    share: float
    measured_on: int  # items tried (0: the default share)
    requests_expected: float
    input_tokens_per_request: float
    cost_low: float
    cost_expected: float
    cost_high: float


class QuotePasses(QuotePart):
    first: PassCost
    probes: ProbePass
    retries: RetryPass
    fallback: FallbackPass | None = Field(default=None, exclude_if=_absent)  # a job with a fallback only


class Calibration(QuotePart):
    factor: float  # measured / the manifest's bytes-per-token estimate: what the budget guard scales
    items_measured: int
    tokenizer_factor: float  # measured / the tokenizer's count


class CacheTerms(QuotePart):
    prefix_tokens: int
    writes_billed: bool
    ttl: str | None
    write_multiplier: float
    first_write_batches: int


class CascadePass(QuotePart):
    """One pass of a multi-pass job (``passes.PassQuote``), as the quote stores it."""

    number: int
    job: str
    model: str
    backend: str
    share: float
    share_source: str
    measured_on: int
    requests: int
    cost_expected: float
    cost_high: float
    spent_usd: float = 0.0
    priced_from: str = "own quote"


class CascadeTotal(QuotePart):
    expected: float
    high: float
    spent_usd: float


class Cascade(QuotePart):
    passes: list[CascadePass]
    total: CascadeTotal
    left_out: dict[str, str] = Field(default_factory=dict)  # later passes whose spec did not load: why


class RouteGroup(QuotePart):
    """The shards a routed job sends to one backend/model, and their quote."""

    shards: int
    requests: int
    est_cost_usd: Levels


class Quote(QuotePart):
    """What the job's pending items are expected to cost, bound to a fingerprint of its inputs, until it expires."""

    version: int = QUOTE_VERSION
    job: str
    model: str
    backend: str
    pending_requests: int
    probe_requests: int
    price: Price
    calibration: Calibration
    tokenizer: RequestTokens
    cache_hit_share: Levels
    cache_write_share: Levels
    cache: CacheTerms
    passes: QuotePasses
    cascade: Cascade | None  # a multi-pass job's passes (``core/money/passes.py``); None for one pass
    est_cost_usd: Levels
    spent_usd: float
    budget_usd: float | None
    within_budget: bool
    components: dict[str, str]  # what the fingerprint hashes, each apart (``quote.quote_components``)
    fingerprint: str
    created_at: str
    expires_at: str
    # a routed job (backend: auto): every pending shard's choice (``RouteChoice.as_dict``) and the groups priced
    route: list[dict[str, Any]] | None = Field(default=None, exclude_if=_absent)
    route_groups: dict[str, RouteGroup] | None = Field(default=None, exclude_if=_absent)

    def as_json(self) -> dict[str, Any]:
        """The stored and shown form: plain JSON types (dates as ISO strings)."""
        return self.model_dump(mode="json")


def read_quote(store: Store, job: str, rel: str | None = None) -> Quote | None:
    """The job's current quote (or the one at ``rel``); None when there is none or it does not read (it is then
    made again before any spend: the driver re-quotes, a submission refuses)."""
    raw = store.read_json(rel or JobPaths(job).quote)
    if not raw:
        return None
    try:
        return Quote.model_validate(raw)
    except ValidationError as exc:
        log.warning("job %s: the stored quote does not read (%s); it is made again before any spend", job, exc)
        return None
