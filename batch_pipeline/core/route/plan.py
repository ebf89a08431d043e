"""Routing a job's shards: the candidates' facts and costs per shard, the choice (``rules.choose``), kept per shard.

Routes are decided when the job is quoted, before anything is submitted: a shard without an attempt is routed
again at every quote (its size, the deadline and the prices may have moved); once it has an attempt its route
stays, so its retries and its open batch stay on the backend that has them. The choice is stored per shard
(``JobPaths.shard_route``) and read by the shard's runs, the quote, ``quote --compare`` and the report.
"""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import polars as pl

from batch_pipeline.core.errors import ConfigError
from batch_pipeline.core.ledger.capacity import Need
from batch_pipeline.core.ledger.queue_clock import QueueClock
from batch_pipeline.core.pricing.cost import PriceTable
from batch_pipeline.core.route.rules import Candidate, RouteChoice, ShardFacts, choose
from batch_pipeline.core.spec.job import BackendSpec, JobSpec, RouteCandidate
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store


@dataclass(frozen=True)
class BackendProfile:
    """What the rules need to know of a backend, read off its executor class (``executors.registry``)."""

    self_hosted: bool
    batch: bool
    min_requests: int = 0
    max_requests: int | None = None
    turnaround_h: float = 0.0


Profile = Callable[[BackendSpec], BackendProfile]
Queues = Callable[[BackendSpec, str], QueueClock | None]  # a candidate's account queues (None: it has none)


def candidates(spec: JobSpec) -> list[RouteCandidate]:
    """The route's candidates and its online choice (once)."""
    assert spec.route is not None
    out = list(spec.route.candidates)
    if all(c.backend != spec.route.online.backend for c in out):
        out.append(spec.route.online)
    return out


def routed_variant(spec: JobSpec, backend: BackendSpec, model: str | None) -> JobSpec:
    """The job as one routed shard runs it: that backend and model, everything else the job's."""
    return spec.model_copy(update={"backend": backend, "model": model or spec.model})


def candidate_for(spec: JobSpec, choice: RouteChoice) -> RouteCandidate:
    for c in candidates(spec):
        if c.backend.name == choice.backend and (c.model or spec.model) == choice.model:
            return c
    raise ConfigError(
        f"job {spec.name}: shard {choice.shard_id} is routed to {choice.backend}/{choice.model}, "
        "which is no longer a route candidate; re-quote"
    )


def hours_to_deadline(spec: JobSpec, now: datetime | None = None) -> float | None:
    if spec.deadline is None:
        return None
    deadline = spec.deadline if spec.deadline.tzinfo else spec.deadline.replace(tzinfo=UTC)
    return (deadline - (now or datetime.now(UTC))).total_seconds() / 3600


def shard_costs(
    spec: JobSpec,
    prices: PriceTable,
    profile: BackendProfile,
    backend: BackendSpec,
    model: str,
    input_tokens: float,
    items: int,
) -> float | None:
    """The shard's estimated cost on one candidate: its input and every output token allowed (None: no price)."""
    try:
        price = prices.lookup(backend.name, model)
    except ConfigError:
        return None
    return float(price.cost(input_tokens, items * spec.max_output_tokens, batch=profile.batch))


def route_shard(
    spec: JobSpec,
    prices: PriceTable,
    profile: Profile,
    shard_id: str,
    items: int,
    input_tokens: float,
    now: datetime | None = None,
    clocks: dict[str, QueueClock | None] | None = None,
) -> RouteChoice:
    """The shard's route; ``clocks`` (candidate label -> its queues) weighs a full queue against the deadline, and
    the chosen queue takes the shard's place, so the next shard of the plan waits behind it."""
    assert spec.route is not None
    cands = []
    need = Need(int(input_tokens), items, 1)
    for c in candidates(spec):
        p = profile(c.backend)
        model = c.model or spec.model
        label = f"{c.backend.name}/{model}"
        clock = (clocks or {}).get(label)
        cands.append(
            Candidate(
                c.backend.name,
                model,
                p.self_hosted,
                p.batch,
                p.min_requests,
                p.max_requests,
                p.turnaround_h,
                shard_costs(spec, prices, p, c.backend, model, input_tokens, items),
                clock.hours_until_room(need, now) if clock is not None else 0.0,
            )
        )
    facts = ShardFacts(
        shard_id, items, spec.route.data_may_leave, spec.route.min_batch_items, hours_to_deadline(spec, now)
    )
    choice = choose(cands, facts)
    chosen = (clocks or {}).get(f"{choice.backend}/{choice.model}")
    if chosen is not None:
        chosen.take(need, now)
    return choice


def queue_clocks(spec: JobSpec, queues: Queues | None) -> dict[str, QueueClock | None]:
    """Each candidate's account queues as they stand now, read once per plan."""
    if queues is None or spec.route is None:
        return {}
    return {
        f"{c.backend.name}/{c.model or spec.model}": queues(c.backend, c.model or spec.model) for c in candidates(spec)
    }


class RouteBook:
    """The stored route of each shard of one job."""

    def __init__(self, store: Store, job: str):
        self.store, self.paths = store, JobPaths(job)

    def get(self, shard_id: str) -> RouteChoice | None:
        raw = self.store.read_json(self.paths.shard_route(shard_id))
        return RouteChoice.from_dict(raw["choice"]) if raw else None

    def put(self, choice: RouteChoice) -> None:
        self.store.write_json(
            self.paths.shard_route(choice.shard_id),
            {"choice": choice.as_dict(), "decided_at": datetime.now(UTC).isoformat()},
        )


def plan_routes(
    spec: JobSpec,
    store: Store,
    prices: PriceTable,
    profile: Profile,
    pending: pl.DataFrame,
    attempted: set[str],
    now: datetime | None = None,
    queues: Queues | None = None,
) -> dict[str, RouteChoice]:
    """Route every shard with pending items (``pending``: request_id, shard_id, est_input_tokens); shards in
    ``attempted`` keep the route they have."""
    book = RouteBook(store, spec.name)
    out: dict[str, RouteChoice] = {}
    if pending.height == 0:
        return out
    clocks = queue_clocks(spec, queues)
    per_shard = pending.group_by("shard_id").agg(pl.len().alias("n"), pl.col("est_input_tokens").sum().alias("t"))
    for shard_id, n, tokens in per_shard.sort("shard_id").iter_rows():
        kept = book.get(shard_id) if shard_id in attempted else None
        if kept is None:
            kept = route_shard(spec, prices, profile, shard_id, n, float(tokens or 0), now, clocks)
            book.put(kept)
        out[shard_id] = kept
    return out


def route_pending(
    spec: JobSpec,
    store: Store,
    prices: PriceTable,
    profile: Profile,
    items: pl.DataFrame,
    states: pl.DataFrame | None,
    now: datetime | None = None,
    queues: Queues | None = None,
) -> dict[str, RouteChoice]:
    """Route the job's shards with pending work before it is quoted (``items``: request_id, shard_id,
    est_input_tokens; ``states``: the item states, with attempts). Nothing for a job that is not routed."""
    if spec.route is None:
        return {}
    pending, attempted = items, set()
    if states is not None and states.height:
        from batch_pipeline.core.ledger.reconcile import DEAD, VALID

        pending = items.join(
            states.filter(pl.col("state").is_in([VALID, DEAD])).select("request_id"), on="request_id", how="anti"
        )
        attempted = set(states.filter(pl.col("attempts") > 0)["shard_id"].unique().to_list())
    if "shard_id" not in pending.columns or "est_input_tokens" not in pending.columns:
        from batch_pipeline.core.manifest.shards import Manifest

        index = pl.from_arrow(Manifest(spec.name, store).item_index(["request_id", "shard_id", "est_input_tokens"]))
        assert isinstance(index, pl.DataFrame)
        pending = index.join(pending.select("request_id"), on="request_id", how="semi")
    return plan_routes(spec, store, prices, profile, pending, attempted, now, queues)
