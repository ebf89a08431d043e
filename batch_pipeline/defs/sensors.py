"""Sensors: new input -> manifest run; provider batch ended -> collect run; retryable shard -> submit run.

Order is explicit: no shard run starts while a manifest run of the job is queued or running, so new
shards are only ever submitted against a finished manifest and a fresh quote.
"""

import hashlib
import json
import os
from datetime import UTC, datetime, timedelta

import dagster as dg
import polars as pl

from batch_pipeline.core.attempts import AttemptLog
from batch_pipeline.core.control import JobControl
from batch_pipeline.core.executor import BatchExecutor, BatchHandle
from batch_pipeline.core.inputs import resolve_inputs
from batch_pipeline.core.manifest import Manifest
from batch_pipeline.core.paths import JobPaths
from batch_pipeline.core.publish import JobState
from batch_pipeline.core.reconcile import INVALID, MISSING
from batch_pipeline.core.spec import JobSpec
from batch_pipeline.defs.jobs import job_names
from batch_pipeline.defs.resources import StoreResource
from batch_pipeline.executors.registry import create_executor

IN_FLIGHT = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
             dg.DagsterRunStatus.STARTED]
INTERVAL_S = int(os.environ.get("BATCH_PIPELINE_SENSOR_INTERVAL_S", "30"))


MAX_FAILED_RUNS = 3  # a shard whose run failed this often for the same attempt waits for a human


def _in_flight(instance: dg.DagsterInstance, job_name: str, partition: str | None = None) -> bool:
    tags = {"dagster/partition": partition} if partition else None
    runs = instance.get_runs(dg.RunsFilter(job_name=job_name, statuses=IN_FLIGHT, tags=tags), limit=1)
    return bool(runs)


def _failed_runs(instance: dg.DagsterInstance, job_name: str, run_key_prefix: str, partition: str) -> int:
    """Runs of this job and shard that failed for the same step (their run key starts with the prefix): the
    next request gets a new key, or Dagster would skip it as already done."""
    runs = instance.get_runs(dg.RunsFilter(job_name=job_name, tags={"dagster/partition": partition},
                                           statuses=[dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]))
    return sum(1 for r in runs if str(r.tags.get("dagster/run_key", "")).startswith(run_key_prefix))


def _keyed_request(instance, job_name: str, shard: str, key: str) -> dg.RunRequest | None:
    failures = _failed_runs(instance, job_name, key, shard)
    if failures >= MAX_FAILED_RUNS:
        return None
    return dg.RunRequest(job_name=job_name, partition_key=shard, run_key=f"{key}:r{failures}" if failures else key)


def input_fingerprint(spec: JobSpec) -> str:
    files = resolve_inputs(spec.input.path, spec.input.format, spec.input_base_dir())
    listing = [(f.uri, f.size, str(f.fs.get_file_info(f.path).mtime)) for f in files]  # a rewrite counts too
    return hashlib.sha256(json.dumps(listing).encode()).hexdigest()[:16]


def _quote_current(store, spec: JobSpec) -> bool:
    quote = store.read_json(JobPaths(spec.name).quote)
    return bool(quote) and datetime.fromisoformat(quote["expires_at"]) > datetime.now(UTC) + timedelta(minutes=2)


def _now_bucket() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M")


def build_new_data_sensor(spec: JobSpec, jobs: dict) -> dg.SensorDefinition:
    @dg.sensor(name=f"{spec.name}_new_data", job=jobs["prepare"], minimum_interval_seconds=INTERVAL_S,
               description=f"New or grown input files of job {spec.name} -> a manifest run.")
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


def build_shard_sensor(spec: JobSpec, jobs: dict) -> dg.SensorDefinition:
    names = job_names(spec)

    @dg.sensor(name=f"{spec.name}_shard_driver",
               jobs=[jobs["quote"], jobs["submit"], jobs["collect"], jobs["publish"]], minimum_interval_seconds=INTERVAL_S,
               description=f"Drives job {spec.name}'s shards: submit new and retryable ones, collect ended batches, "
                           "publish when every item is settled.")
    def shard_sensor(context: dg.SensorEvaluationContext, store: StoreResource):
        st = store.get()
        instance = context.instance
        if _in_flight(instance, names["prepare"]):
            return dg.SkipReason("a manifest run is in progress; shards wait for it")
        stop = JobControl(st, spec.name).current()
        if stop:
            return dg.SkipReason(f"job stopped: {stop['reason']}")
        shard_ids = Manifest(spec.name, st).shard_ids()
        if not shard_ids:
            return dg.SkipReason("no manifest yet")
        requests: list[dg.RunRequest] = []
        executor = None
        waiting = set()
        stuck: list[str] = []
        attempts = {shard: AttemptLog(st, spec.name, shard).all() for shard in shard_ids}  # read once per tick
        for shard in shard_ids:
            open_attempts = [a for a in attempts[shard] if a.open]
            if not open_attempts:
                continue
            waiting.add(shard)
            attempt = open_attempts[-1]
            if not attempt.submitted or _in_flight(instance, names["collect"], shard) or \
                    _in_flight(instance, names["submit"], shard):
                continue
            executor = executor or create_executor(spec.backend)
            if not isinstance(executor, BatchExecutor):
                continue
            status = executor.poll(BatchHandle.from_dict(attempt.submitted))
            if status.state.ended:
                request = _keyed_request(instance, names["collect"], shard, f"collect:{shard}:{attempt.number}")
                if request is None:
                    stuck.append(shard)
                else:
                    requests.append(request)
        state = JobState.load(spec, st)
        retryable = state.states.filter(pl.col("state").is_in([INVALID, MISSING]))
        counts = dict(retryable.group_by("shard_id").len().iter_rows())
        candidates = [s for s in shard_ids if s not in waiting and s in counts]
        canary = shard_ids[0]
        if spec.canary_first and len(shard_ids) > 1 and (canary in waiting or canary in counts):
            candidates = [s for s in candidates if s == canary]  # nothing else until the canary settled
        if candidates and not _quote_current(st, spec):
            if not _in_flight(instance, names["quote"]):
                requests.append(dg.RunRequest(job_name=names["quote"], run_key=f"quote:{_now_bucket()}"))
            candidates = []
        for shard in candidates:
            if _in_flight(instance, names["submit"], shard):
                continue
            attempt_no = len(attempts[shard]) + 1
            request = _keyed_request(instance, names["submit"], shard, f"submit:{shard}:{attempt_no}")
            if request is None:
                stuck.append(shard)
            else:
                requests.append(request)
        busy = any(_in_flight(instance, names[j]) for j in ("quote", "submit", "collect", "publish"))
        if not requests and not waiting and not counts and not busy:
            settled = int(state.results.height)
            requests.append(dg.RunRequest(job_name=names["publish"], run_key=f"publish:{settled}"))
        if requests:
            return requests
        why = [f"{len(waiting)} batch(es) open at the provider"] if waiting else []
        if stuck:
            why.append(f"shard(s) {', '.join(stuck)} failed {MAX_FAILED_RUNS} runs in a row: look at their runs")
        if counts and not waiting:
            why.append("waiting for in-flight runs or the canary")
        return dg.SkipReason("; ".join(why) or "nothing to do")

    return shard_sensor
