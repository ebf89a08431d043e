"""Run a whole job through Dagster in-process: prepare, then the driver's plan pass by pass, then publish.

The same assets the UI shows, materialized with ``materialize()`` against a real instance (so runs
appear in ``dagster dev``). Each pass asks the driver (``core/state``) for the plan and runs it: the canary
alone first, then the shards to submit, resolve, rescue or collect, in ranges (``shard_ranges``: one run
moves up to ``shards_per_run`` shards, the setting of that name by default). A pass is a resume: only items
that are neither valid nor dead-lettered are sent. Nothing here decides what a shard needs; the plan does.
"""

import logging
import time
from collections.abc import Callable
from datetime import datetime

import dagster as dg

from batch_pipeline.core import progress
from batch_pipeline.core.errors import BatchPipelineError
from batch_pipeline.core.ledger.control import JobPaused
from batch_pipeline.core.ledger.machine import ShardState
from batch_pipeline.core.publish import current
from batch_pipeline.core.publish.current import PublishBasis
from batch_pipeline.core.run.activity import Activity
from batch_pipeline.core.run.hygiene import sweep_due
from batch_pipeline.core.settings import Settings
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.state.driver import Action, Plan, WaitKind
from batch_pipeline.core.state.ranges import ShardRange, shard_ranges
from batch_pipeline.core.state.turns import MOVES, SENDS, TurnLimits
from batch_pipeline.core.state.view import load_view
from batch_pipeline.defs.assets import SHARDS_TAG, asset_key, shards_partitions
from batch_pipeline.defs.build import build_definitions
from batch_pipeline.defs.jobs import PUBLISH_ASSETS
from batch_pipeline.defs.runners import executor_for
from batch_pipeline.defs.sensors import batch_poller
from batch_pipeline.executors.registry import batch_minimums, capacity_ledgers, create_executor

log = logging.getLogger(__name__)

RANGE_START = "dagster/asset_partition_range_start"
RANGE_END = "dagster/asset_partition_range_end"
SHARD_ASSETS = ["submissions", "shard_results"]


def _quiet(level: str) -> dict:
    return {"loggers": {"console": {"config": {"log_level": level}}}}


def run_job(
    spec: JobSpec,
    instance: dg.DagsterInstance,
    resources: dict | None = None,
    *,
    settings: Settings | None = None,
    shards_per_run: int | None = None,
    log_level: str = "WARNING",
    on_stage: Callable[[str], None] | None = None,
) -> dict:
    """Prepare, carry out the driver's plans until it says publish (or a limit is reached), publish; the report.
    ``settings``: the edge's (the CLI's); unset, the defaults; ``resources`` default to the settings'."""
    settings = settings or Settings()
    span = shards_per_run or settings.shards_per_run
    return PassLoop(spec, instance, resources, settings, span, log_level, on_stage or (lambda s: None)).run()


class PassLoop:
    """The CLI's loop: each turn asks the driver for the plan and materializes what it says, in-process."""

    def __init__(
        self,
        spec: JobSpec,
        instance: dg.DagsterInstance,
        resources: dict | None,
        settings: Settings,
        span: int,
        log_level: str,
        stage: Callable[[str], None],
    ):
        defs = build_definitions([spec], resources, settings)
        self.spec, self.instance, self.span, self.log_level, self.stage = spec, instance, span, log_level, stage
        self.graph_assets = list(defs.assets or []) + list(defs.asset_checks or [])
        self.resources = defs.resources
        self.limits = TurnLimits.for_spec(spec)
        self.passes = self.canaries = self.requotes = 0
        self.quoted_last: float | None = None  # when the last run was a quote (nothing was spent since), else None

    def materialize(self, names: list[str], **kwargs) -> dg.ExecuteInProcessResult:
        result = dg.materialize(
            self.graph_assets,
            selection=[asset_key(self.spec, n) for n in names],
            instance=self.instance,
            resources=self.resources,
            run_config=_quiet(self.log_level),
            raise_on_error=False,
            **kwargs,
        )
        if not result.success:
            raise dg.Failure(_failure_message(result))
        # a run with the quote spent nothing (the quote alone, or the prepare run's manifest and quote)
        self.quoted_last = time.monotonic() if "quote" in names else None
        return result

    def quote(self) -> None:
        """A fresh quote to spend against, unless the last run was one, of the last minute (the re-quote turn just
        before: one Dagster run fewer per job)."""
        if self.quoted_last is None or time.monotonic() - self.quoted_last > QueueLoop.REQUOTE_S:
            self.materialize(["quote"])

    def run(self) -> dict:
        spec = self.spec
        self.store = self.resources["store"].get()
        self.stage("manifest")
        with progress.opened("manifest", None, "bytes"):  # a bar only when there is something to read
            self.materialize(prepare_assets(spec, published=current.recorded(self.store, spec.name) is not None))
        self.tail = spec.tail.backend.name if spec.tail is not None else None
        self.all_shards = self.instance.get_dynamic_partitions(shards_partitions(spec).name)
        self.queue = QueueLoop(spec, self.store, self.stage, self.limits)
        while self._turn(self._plan()):
            pass
        report = self._publish()
        report["passes"] = self.passes
        return report

    def _publish(self) -> dict:
        """Publish, unless the last publish was made from the same spec, inputs and shard summaries (a finished job
        run again): then its tables stand, nothing is read, and the report only takes this run's manifest figures."""
        basis = PublishBasis.of(self.spec, self.store, self.summaries)
        due = sweep_due(self.spec, self.store, executor_for(self.spec))  # the publish run would delete copies
        report = None if due else current.standing(self.spec, self.store, basis)
        if report is not None:
            at = datetime.fromisoformat(report["published_at"]).isoformat(timespec="seconds")
            self.stage(f"publish: nothing changed since the publish at {at}: the published tables stand")
            return current.carry_forward(self.spec, self.store, report, basis)
        self.stage("publish")
        self.materialize(PUBLISH_ASSETS)
        current.record(self.store, self.spec.name, basis)
        return self.store.read_json(JobPaths(self.spec.name).report) or {}

    def _plan(self) -> Plan:
        queue = self.queue
        view = load_view(
            self.spec,
            self.store,
            **batch_minimums(self.spec),
            capacity=queue.ledgers,
            batch_ended=queue.poller if queue.bound else None,
            waits_inline=not queue.bound,  # shard_results waits on an open batch, unless the queue loop polls them
        )
        self.summaries = view.summaries  # what the publish is decided on, once the plan says publish
        plan = view.plan()
        log.info("job %s: plan: %s", self.spec.name, plan.describe())
        if plan.stopped:
            raise dg.Failure(f"job stopped: {plan.stopped}")
        if plan.paused:  # a deploy: running shards stored what finished and returned; nothing new goes out
            raise JobPaused(f"job {self.spec.name} is paused: {plan.describe()}")
        return plan

    def _turn(self, plan: Plan) -> bool:
        """One turn of the plan; False when it is time to publish."""
        if plan.publish:
            return False
        if plan.has(Action.REQUOTE):
            self.requotes += 1
            if (why := self.limits.too_many_requotes(self.requotes, plan.describe())) is not None:
                raise dg.Failure(why)
            self.materialize(["quote"])
            return True
        self.requotes = 0
        if plan.waiting_for(WaitKind.QUOTA) and not plan.has(Action.CANARY):
            # the account's queue is full: send what fits, collect what ended, wait on the provider in between
            if self.queue.step(plan, self._ranged, self.all_shards, self.span):
                return True
        canary = plan.shards(Action.CANARY)
        if canary:
            self._canary(canary[0], plan)
            return True
        todo = sorted(set(plan.shards(*MOVES)))
        if not todo or self.passes >= self.limits.passes:
            if todo or plan.waiting:
                log.warning("job %s: publishing what there is: %s", self.spec.name, plan.describe())
            return False
        self._pass(plan, todo)
        return True

    def _ranged(self, names: list[str], r: ShardRange | None) -> None:
        self.materialize(names, **({"tags": range_tags(r)} if r else {}))

    def _canary(self, shard: str, plan: Plan) -> None:
        self.canaries += 1
        if (why := self.limits.too_many_canaries(self.canaries, shard, plan.describe())) is not None:
            raise dg.Failure(why)
        self.stage(
            f"canary: shard {shard} ({self.spec.canary.size} items at most, alone)"
            + (f" (attempt {self.canaries})" if self.canaries > 1 else "")
        )
        self.quote()  # the canary spends against a fresh quote too
        did = Activity(self.store, self.spec.name, self.tail)
        with progress.opened("submit", 1, "shards"), progress.opened("collect", 0, "shards"):
            self.materialize(SHARD_ASSETS, partition_key=shard)  # its batch, if it makes one, is the one to collect
        self.stage(f"canary done: {did.since().describe()}")

    def _pass(self, plan: Plan, todo: list[str]) -> None:
        self.passes += 1
        self.stage(f"pass {self.passes}: {len(todo)} shard(s), planned: {plan.describe()}")
        self.quote()  # every pass spends against a fresh quote
        did = Activity(self.store, self.spec.name, self.tail)
        sends = set(plan.shards(*SENDS))
        # batches open now (a rescue collects its own); each batch the pass makes adds one (progress.expect)
        open_now = [
            s for s in todo if s not in sends and plan.states.get(s) in (ShardState.SUBMITTED, ShardState.ENDED)
        ]
        with (
            progress.opened("submit", len(sends & set(todo)), "shards"),
            progress.opened("collect", len(open_now), "shards"),
        ):
            for r in shard_ranges(self.all_shards, todo, self.span):  # the ranges' assets count towards the bars
                self.materialize(SHARD_ASSETS, tags=range_tags(r))
        self.stage(f"pass {self.passes} done: {did.since().describe()}")  # what it did, whatever the plan said


def prepare_assets(spec: JobSpec, published: bool) -> list[str]:
    """What the loop's first run materializes: the manifest (and the backend comparison), and, for a job never
    published, its quote, as the sensors' prepare job does: such a job has work to spend on, and the quote it would
    take before its first spend is one Dagster run fewer here. A published job run again may have nothing to send;
    it quotes when it does."""
    compare = ["backend_comparison"] if spec.cost_compare is not None else []
    return ["manifest", *compare, *([] if published else ["quote"])]


def range_tags(r: ShardRange) -> dict[str, str]:
    return {RANGE_START: r.start, RANGE_END: r.end, SHARDS_TAG: ",".join(r.shards)}


class QueueLoop:
    """While shards wait for room in the account's queue, the pass loop stops waiting on batches inline: each turn
    submits what the plan admits, collects the batches the provider ended (polled, as the sensor does), and waits
    one poll interval when neither moved, so the queue is refilled the moment a batch ends."""

    REQUOTE_S = 60.0  # a sending turn re-quotes first when its last quote is older (the driver re-quotes stale ones)

    def __init__(self, spec: JobSpec, store, stage: Callable[[str], None], limits: TurnLimits):
        self.spec, self.store, self.stage, self.limits = spec, store, stage, limits
        self.ledgers = capacity_ledgers(store, spec.backend, spec.model)
        self.poller = batch_poller(spec)
        self.bound = False  # set once a shard waited for room: from then on, open batches are polled
        self.idle = 0
        self.said = 0.0
        self.poll_s = _poll_interval(spec)
        self.quoted: float | None = None  # monotonic time of this loop's last quote

    def step(self, plan, run: Callable[[list[str], ShardRange], object], order: list[str], span: int) -> bool:
        """One turn; False when the plan has other work for the ordinary pass (the canary, a re-quote)."""
        self.bound = True
        send = plan.shards(*SENDS)
        collect = plan.shards(Action.COLLECT)
        if send:
            if self.quoted is None or time.monotonic() - self.quoted > self.REQUOTE_S:
                run(["quote"], None)  # every submission spends against a quote of the last minute
                self.quoted = time.monotonic()
            for r in shard_ranges(order, send, span):
                run(["submissions"], r)
        for r in shard_ranges(order, collect, span):
            run(["shard_results"], r)
        if send or collect:
            self.idle = 0
            return True
        open_batches = any(st == ShardState.SUBMITTED for st in plan.states.values())
        held = [h for ledger in self.ledgers for h in ledger.snapshot().holdings]
        if not open_batches and not held:
            self.idle += 1
            if (why := self.limits.queue_never_fits(self.idle, self.spec.name, plan.describe())) is not None:
                raise dg.Failure(why)
        if time.monotonic() - self.said > 30:
            self.said = time.monotonic()
            self.stage(f"waiting for room in the account's queue: {plan.describe()}")
        time.sleep(self.poll_s)
        return True


def _poll_interval(spec: JobSpec) -> float:
    try:
        return float(getattr(create_executor(spec.backend), "poll_interval_s", 2.0))
    except BatchPipelineError:
        return 2.0


def _failure_message(result: dg.ExecuteInProcessResult) -> str:
    msgs = []
    for event in result.all_events:
        if event.event_type_value == "STEP_FAILURE" and event.step_failure_data:
            data = event.step_failure_data
            user = data.user_failure_data.description if data.user_failure_data else None
            msgs.append(f"{event.step_key}: {user or (data.error.message.strip() if data.error else 'failed')}")
        if event.event_type_value == "ASSET_CHECK_EVALUATION":
            data = event.event_specific_data
            if data is not None and not data.passed:
                details = {k: getattr(v, "value", v) for k, v in (data.metadata or {}).items()}
                msgs.append(f"check {data.check_name} failed: {str(details)[:500]}")
    return "; ".join(msgs) or "run failed"
