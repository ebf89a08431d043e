"""Sensors: new input -> manifest run; the shard driver turns the driver's plan (core/state) into runs.

Order is explicit: no shard run starts while a manifest run of the job is queued or running, so new shards are only
ever submitted against a finished manifest and a fresh quote. The shard sensor decides nothing itself: it polls the
open batches it may (bounded per tick), asks ``next_steps`` for the plan, and requests its steps as runs: the canary
alone, the other shards packed by ``shard_ranges`` into partition-range runs of at most ``shards_per_run`` shards
(a range that failed is asked again shard by shard, so one bad shard cannot hold its neighbours back).
"""

import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import dagster as dg

from batch_pipeline.core.errors import TransientError
from batch_pipeline.core.ledger.executor import BatchExecutor
from batch_pipeline.core.manifest.inputs import resolve_inputs
from batch_pipeline.core.manifest.shards import Manifest
from batch_pipeline.core.settings import Settings
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.state.driver import Action, Step
from batch_pipeline.core.state.ranges import ShardRange, shard_ranges
from batch_pipeline.core.state.turns import STAGE_OF, RunStage, TurnLimits
from batch_pipeline.core.state.view import load_view
from batch_pipeline.defs.assets import SHARDS_TAG, shards_partitions
from batch_pipeline.defs.jobs import job_names
from batch_pipeline.defs.resources import StoreResource
from batch_pipeline.executors.registry import batch_minimums, capacity_ledgers, create_executor

IN_FLIGHT = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]
FAILED = [dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]
ENDED = [dg.DagsterRunStatus.SUCCESS, *FAILED]
STEP_TAG = "batch_pipeline/step"  # the run job and what it does: its run key without the ``:rN`` of a repeat
RANGE_START, RANGE_END = "dagster/asset_partition_range_start", "dagster/asset_partition_range_end"


POLL_WORKERS = 8


def _in_flight(instance: dg.DagsterInstance, job_name: str, partition: str | None = None) -> bool:
    tags = {"dagster/partition": partition} if partition else None
    runs = instance.get_runs(dg.RunsFilter(job_name=job_name, statuses=IN_FLIGHT, tags=tags), limit=1)
    return bool(runs)


def _ended_runs(instance: dg.DagsterInstance, job_name: str, step: str) -> list[dg.DagsterRun]:
    """Runs of this job that ended for the same step (their ``STEP_TAG``), failed or not. The next request for the
    step gets a new run key (``step:rN``): a run that ended without moving the shard (a submit whose room another
    job took first) would otherwise be asked for again under its own key, which Dagster skips as done, and the
    shard would wait forever."""
    return list(instance.get_runs(dg.RunsFilter(tags={STEP_TAG: _step_tag(job_name, step)}, statuses=ENDED)))


def _step_tag(job_name: str, step: str) -> str:
    return f"{job_name}/{step}"


def _failures(runs: list[dg.DagsterRun]) -> int:
    return sum(1 for r in runs if r.status in FAILED)


def _run_key(step: str, ended: list[dg.DagsterRun]) -> str:
    return f"{step}:r{len(ended)}" if ended else step


def _keyed_request(instance, job_name: str, shard: str, key: str, limits: TurnLimits) -> dg.RunRequest | None:
    ended = _ended_runs(instance, job_name, key)
    if limits.stuck(_failures(ended)):
        return None
    return dg.RunRequest(
        job_name=job_name, partition_key=shard, run_key=_run_key(key, ended), tags={STEP_TAG: _step_tag(job_name, key)}
    )


def _step_key(step: Step, attempts: dict[str, int]) -> str:
    """Keyed by the attempt a step makes (or collects): a failed run of it gets a new key and retries."""
    assert step.shard_id is not None
    attempt = attempts[step.shard_id] + (0 if step.action == Action.COLLECT else 1)
    return f"{step.action.value}:{step.shard_id}:{attempt}"


def _shard_requests(
    instance,
    stage: str,
    job_name: str,
    steps: list[Step],
    attempts: dict[str, int],
    order: list[str],
    span: int,
    limits: TurnLimits,
    limit: int,
) -> tuple[list[dg.RunRequest], list[str]]:
    """The steps of one run job as at most ``limit`` runs: a single shard (the canary always) keeps its per-shard
    key; several shards go as one partition range keyed by what each does. Also returns the shards that failed
    too often."""
    keys = {s.shard_id: _step_key(s, attempts) for s in steps if s.shard_id is not None}
    alone = [s.shard_id for s in steps if s.action == Action.CANARY and s.shard_id is not None]
    ranges = [ShardRange(s, s, (s,)) for s in alone]
    ranges += shard_ranges(order, [k for k in keys if k not in alone], span)
    requests, stuck = [], []
    for r in ranges:
        if len(requests) >= limit:
            break
        step = f"{stage}:{r.start}..{r.end}:{r.digest(keys[s] for s in r.shards)}"
        ended = [] if r.single else _ended_runs(instance, job_name, step)
        if r.single or _failures(ended):
            for shard in r.shards:  # alone, or again shard by shard after the range failed
                request = _keyed_request(instance, job_name, shard, keys[shard], limits)
                requests.extend([request] if request is not None else [])
                stuck.extend([] if request is not None else [shard])
            continue
        requests.append(
            dg.RunRequest(
                job_name=job_name,
                run_key=_run_key(step, ended),
                tags={
                    RANGE_START: r.start,
                    RANGE_END: r.end,
                    SHARDS_TAG: ",".join(r.shards),
                    STEP_TAG: _step_tag(job_name, step),
                },
            )
        )
    return requests, stuck


def input_fingerprint(spec: JobSpec) -> str:
    files = resolve_inputs(spec.input.path, spec.input.format, spec.input_base_dir())
    listing = [(f.uri, f.size, str(f.fs.get_file_info(f.path).mtime)) for f in files]  # a rewrite counts too
    return hashlib.sha256(json.dumps(listing).encode()).hexdigest()[:16]


def _now_bucket() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M")


def sensor_args(spec: JobSpec, settings: Settings, name: str, description: str) -> dict:
    """What the sensors of one job share: the name ``<job>_<name>`` and the tick of ``sensor_interval_s``
    (each sensor adds the job or jobs it starts)."""
    return {
        "name": f"{spec.name}_{name}",
        "minimum_interval_seconds": settings.sensor_interval_s,
        "description": description,
    }


def build_new_data_sensor(spec: JobSpec, jobs: dict, settings: Settings | None = None) -> dg.SensorDefinition:
    """New or grown input files -> a manifest run. ``settings``: the edge's (unset: the defaults)."""
    settings = settings or Settings()

    @dg.sensor(
        **sensor_args(spec, settings, "new_data", f"New or grown input files of job {spec.name} -> a manifest run."),
        job=jobs["prepare"],
    )
    def new_data(context: dg.SensorEvaluationContext):
        try:
            fingerprint = input_fingerprint(spec)
        except Exception as exc:  # an empty or unreachable input folder is a skip, not a crash
            return dg.SkipReason(f"no input: {exc}")
        if fingerprint == context.cursor:
            return dg.SkipReason("input unchanged")
        context.update_cursor(fingerprint)
        return dg.RunRequest(run_key=f"prepare:{fingerprint}", tags={"batch_pipeline/trigger": "new_data"})

    return new_data


def build_upstream_sensor(spec: JobSpec, jobs: dict, settings: Settings | None = None) -> dg.SensorDefinition:
    """A later pass of a multi-pass job (``input.from_job``): each new publish of the upstream's ``validated``
    asset -> a manifest run of this job (its new rows, and the rows whose upstream answer changed)."""
    assert spec.input.from_job is not None
    settings = settings or Settings()
    upstream = dg.AssetKey([spec.input.from_job, "validated"])

    @dg.sensor(
        **sensor_args(
            spec,
            settings,
            "upstream",
            f"A new publish of {upstream.to_user_string()} -> a manifest run of job {spec.name}.",
        ),
        job=jobs["prepare"],
    )
    def upstream_published(context: dg.SensorEvaluationContext):
        latest = context.instance.fetch_materializations(upstream, limit=1).records
        if not latest:
            return dg.SkipReason(f"{upstream.to_user_string()} has not been published yet")
        storage_id = str(latest[0].storage_id)
        if storage_id == context.cursor:
            return dg.SkipReason(f"no new publish of {upstream.to_user_string()}")
        context.update_cursor(storage_id)
        return dg.RunRequest(
            run_key=f"prepare:{spec.input.from_job}:{storage_id}",
            tags={"batch_pipeline/trigger": "upstream", "batch_pipeline/upstream": spec.input.from_job},
        )

    return upstream_published


def build_shard_sensor(spec: JobSpec, jobs: dict, settings: Settings | None = None) -> dg.SensorDefinition:
    """The driver's plan each tick -> the runs it asks for. ``settings``: the edge's (unset: the defaults)."""
    settings = settings or Settings()
    names = job_names(spec)
    limits = TurnLimits.for_spec(spec)

    @dg.sensor(
        **sensor_args(
            spec,
            settings,
            "shard_driver",
            f"Drives job {spec.name}'s shards by the driver's plan: the canary first, then submit, "
            "resolve orphaned intents, rescue near the deadline, collect ended batches, publish when "
            "every item is settled.",
        ),
        jobs=[jobs["quote"], jobs["submit"], jobs["collect"], jobs["publish"]],
    )
    def shard_sensor(context: dg.SensorEvaluationContext, store: StoreResource):
        st = store.get()
        instance = context.instance
        if _in_flight(instance, names["prepare"]):
            return dg.SkipReason("a manifest run is in progress; shards wait for it")
        shard_ids = Manifest(spec.name, st).shard_ids()
        if not shard_ids:
            return dg.SkipReason("no manifest yet")
        in_flight = frozenset(_partitions_in_flight(instance, [names["submit"], names["collect"]], shard_ids))
        busy = bool(in_flight) or any(_in_flight(instance, names[j]) for j in ("quote", "publish"))

        view = load_view(
            spec,
            st,
            in_flight=in_flight,
            busy=busy,
            batch_ended=batch_poller(spec),
            **batch_minimums(spec),
            capacity=capacity_ledgers(st, spec.backend, spec.model),
        )
        plan = view.plan()
        attempts = {s.shard_id: s.attempts for s in view.summaries}
        if plan.stopped:
            return dg.SkipReason(f"job stopped: {plan.stopped}")
        if plan.paused:
            return dg.SkipReason("job paused: `batch-pipeline resume` continues it")
        requests: list[dg.RunRequest] = []
        stuck: list[str] = []
        moves: dict[RunStage, list[Step]] = {}
        for step in plan.steps:
            stage = STAGE_OF[step.action]
            if stage == RunStage.QUOTE:
                if not _in_flight(instance, names[stage]):
                    requests.append(dg.RunRequest(job_name=names[stage], run_key=f"quote:{_now_bucket()}"))
            elif stage == RunStage.PUBLISH:
                settled = sum(s.valid + s.dead_lettered for s in view.summaries)
                requests.append(dg.RunRequest(job_name=names[stage], run_key=f"publish:{settled}"))
            else:
                moves.setdefault(stage, []).append(step)
        if moves:
            shard_runs, held = _move_requests(instance, spec, moves, attempts, limits, settings.shards_per_run)
            requests += shard_runs
            stuck += held
        if requests:
            return requests
        why = [plan.describe()]
        if stuck:
            why.append(limits.stuck_reason(stuck))
        return dg.SkipReason("; ".join(why))

    return shard_sensor


def _move_requests(
    instance: dg.DagsterInstance,
    spec: JobSpec,
    moves: dict[RunStage, list[Step]],
    attempts: dict[str, int],
    limits: TurnLimits,
    span: int,
) -> tuple[list[dg.RunRequest], list[str]]:
    """The shard runs of one tick, run job by run job, at most ``runs_per_tick`` in all; and the shards that
    failed too often."""
    names = job_names(spec)
    order = instance.get_dynamic_partitions(shards_partitions(spec).name)
    shard_runs: list[dg.RunRequest] = []
    stuck: list[str] = []
    for stage, steps in moves.items():
        made, held = _shard_requests(
            instance,
            stage,
            names[stage],
            steps,
            attempts,
            order,
            span,
            limits,
            limit=limits.runs_per_tick - len(shard_runs),
        )
        shard_runs += made
        stuck += held
    return shard_runs[: limits.runs_per_tick], stuck


def batch_poller(spec: JobSpec):
    """Which of the submitted shards' batches the provider has ended: each open batch is asked at the backend its
    handle names (routed shards, the tail, the fallback)."""

    def batch_ended(submitted) -> set[str]:
        backends = spec.sending_backends()
        ended: set[str] = set()
        for name in sorted({s.open.submitted.backend for s in submitted if s.open and s.open.submitted}):
            executor = create_executor(backends[name]) if name in backends else None
            if isinstance(executor, BatchExecutor):
                ended |= ended_batches(
                    executor,
                    [s for s in submitted if s.open and s.open.submitted and s.open.submitted.backend == name],
                )
        return ended

    return batch_ended


def ended_batches(executor: BatchExecutor, submitted, limit: int = TurnLimits.polls_per_tick) -> set[str]:
    """The shards whose provider batch has ended, asking about the longest-waiting ``limit`` of them, concurrently
    (one tick of a 10,000-shard job must not make thousands of round trips one after another)."""
    waiting = sorted((s for s in submitted if s.open and s.open.submitted), key=lambda s: s.open.intent_at)[:limit]

    def ended(summary) -> str | None:
        try:
            return summary.shard_id if executor.poll(summary.open.submitted.handle()).state.ended else None
        except TransientError:  # a flaky poll is asked again next tick
            return None

    with ThreadPoolExecutor(max_workers=POLL_WORKERS) as pool:
        return {shard for shard in pool.map(ended, waiting) if shard}


def _partitions_in_flight(instance: dg.DagsterInstance, jobs: list[str], shard_ids: list[str]) -> set[str]:
    """Shards that a queued or running run of these jobs holds: its partition, the shards it moves, or (a range
    from elsewhere, e.g. a UI backfill) every shard of its range."""
    out: set[str] = set()
    for name in jobs:
        for run in instance.get_runs(dg.RunsFilter(job_name=name, statuses=IN_FLIGHT)):
            if run.tags.get("dagster/partition"):
                out.add(run.tags["dagster/partition"])
            start, end = run.tags.get(RANGE_START), run.tags.get(RANGE_END)
            if run.tags.get(SHARDS_TAG):
                out.update(run.tags[SHARDS_TAG].split(","))
            elif start and end:
                out.update(s for s in shard_ids if start <= s <= end)
    return out
