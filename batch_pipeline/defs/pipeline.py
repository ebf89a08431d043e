"""Run a whole job through Dagster in-process: prepare, shard passes, publish.

The same assets the UI shows, materialized with ``materialize()`` against a real instance (so runs
appear in ``dagster dev``). Shards run in ranges (one run takes up to ``shards_per_run`` partitions);
after each pass, shards with retryable items run again until none are left or the per-item budget is
spent. Each pass is a resume: only items that are neither valid nor dead-lettered are sent.
"""

import logging
from collections.abc import Callable

import dagster as dg
import polars as pl

from batch_pipeline.core.golden import canary_passed
from batch_pipeline.core.publish import JobState
from batch_pipeline.core.reconcile import INVALID, MISSING
from batch_pipeline.core.spec import JobSpec
from batch_pipeline.defs.assets import asset_key, shards_partitions
from batch_pipeline.definitions import build_definitions

log = logging.getLogger(__name__)

RANGE_START = "dagster/asset_partition_range_start"
RANGE_END = "dagster/asset_partition_range_end"


def _quiet(level: str) -> dict:
    return {"loggers": {"console": {"config": {"log_level": level}}}}


def retryable_shards(state: JobState) -> list[str]:
    return sorted(state.states.filter(pl.col("state").is_in([INVALID, MISSING]))["shard_id"].unique().to_list())


def run_job(spec: JobSpec, instance: dg.DagsterInstance, resources: dict | None = None, *,
            shards_per_run: int = 50, log_level: str = "WARNING",
            on_stage: Callable[[str], None] | None = None) -> dict:
    defs = build_definitions([spec], resources)
    graph_assets = list(defs.assets or []) + list(defs.asset_checks or [])
    resources = defs.resources
    stage = on_stage or (lambda s: None)

    def run(names: list[str], **kwargs) -> dg.ExecuteInProcessResult:
        result = dg.materialize(graph_assets, selection=[asset_key(spec, n) for n in names], instance=instance,
                                resources=resources, run_config=_quiet(log_level), raise_on_error=False, **kwargs)
        if not result.success:
            raise dg.Failure(_failure_message(result))
        return result

    stage("manifest")
    run(["manifest"])
    store = resources["store"].get()
    all_shards = instance.get_dynamic_partitions(shards_partitions(spec).name)
    state = JobState.load(spec, store)
    todo = retryable_shards(state)  # all of them on a new job; none when a finished job is run again
    canary = all_shards[0] if all_shards else None
    if spec.canary_first and len(all_shards) > 1 and _canary_pending(spec, store, state, canary):
        # the canary shard runs alone: it calibrates the token estimate and, with a golden set, gates quality
        for attempt in range(spec.retries.per_item + 1):
            stage(f"canary: shard {canary}" + (f" (attempt {attempt + 1})" if attempt else ""))
            run(["quote"])
            run(["submissions", "shard_results"], partition_key=canary)
            state = JobState.load(spec, store)
            if not _canary_pending(spec, store, state, canary):
                break
        todo = retryable_shards(state)  # every other shard, and the canary's leftovers
    passes = 0
    max_passes = spec.retries.per_item + 2  # expired/cancelled items do not spend their budget
    while todo and passes < max_passes:
        passes += 1
        stage(f"pass {passes}: {len(todo)} shard(s)")
        run(["quote"])  # every pass spends against a fresh quote
        for chunk in _ranges(all_shards, todo, shards_per_run):
            run(["submissions", "shard_results"], tags={RANGE_START: chunk[0], RANGE_END: chunk[-1]})
        todo = retryable_shards(JobState.load(spec, store))
    stage("publish")
    run(["results", "dead_letters", "report"])
    report = store.read_json(f"jobs/{spec.name}/report.json") or {}
    report["passes"] = passes
    return report


def _canary_pending(spec: JobSpec, store, state: JobState, canary: str) -> bool:
    """True while the canary has not done its job: nothing measured yet, or (with a golden set) no verdict."""
    if spec.quality is not None:
        return canary_passed(spec, store) is None
    return state.results.filter(pl.col("shard_id") == canary).height == 0


def _ranges(all_keys: list[str], wanted: list[str], limit: int) -> list[list[str]]:
    """Contiguous runs of wanted keys in partition order, at most ``limit`` long (a range must not skip keys)."""
    wanted_set, out, cur = set(wanted), [], []
    for key in all_keys:
        if key in wanted_set and len(cur) < limit:
            cur.append(key)
            continue
        if cur:
            out.append(cur)
        cur = [key] if key in wanted_set else []
    if cur:
        out.append(cur)
    return out


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
