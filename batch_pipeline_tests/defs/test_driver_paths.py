"""The paths off the happy one, through the driver: rescue over a live batch, systemic codes inside a batch's
files, a canary that stops a bad job early, and an orphaned intent that a sensor-driven job resolves."""

from collections import Counter
from datetime import UTC, datetime, timedelta

import dagster as dg
import polars as pl
import pytest

from batch_pipeline.core.ledger.attempts import AttemptLog
from batch_pipeline.core.ledger.control import JobControl
from batch_pipeline.core.ledger.machine import IllegalTransition, ShardState
from batch_pipeline.core.ledger.result_parts import read_results
from batch_pipeline.core.manifest.shards import Manifest
from batch_pipeline.core.publish.tables import JobState
from batch_pipeline.core.run.summary import ShardSummaries
from batch_pipeline.core.store import Store
from batch_pipeline.defs.assets import asset_key
from batch_pipeline.defs.build import build_definitions
from batch_pipeline.defs.jobs import build_jobs
from batch_pipeline.defs.pipeline import run_job
from batch_pipeline.defs.runners import shard_runner
from batch_pipeline.defs.sensors import build_shard_sensor

from .conftest import batch_creates, ledger_ids

TAIL = {"backend": {"name": "online", "settings": {"sandbox": True, "concurrency": 4}}, "before_deadline_minutes": 60}


def _materialize(spec, instance, resources, names, partition_key=None, tags=None):
    defs = build_definitions([spec], resources)
    return dg.materialize(
        [*defs.assets, *defs.asset_checks],
        selection=[asset_key(spec, n) for n in names],
        partition_key=partition_key,
        instance=instance,
        resources=defs.resources,
        raise_on_error=False,
        tags=tags,
    )


def test_rescue_over_a_live_batch_cancels_it_keeps_its_results_and_sends_the_rest_online_once(
    sandbox, make_job, instance, resources, home
):
    far = (datetime.now(UTC) + timedelta(hours=12)).isoformat()
    spec = make_job(deadline=far, tail=TAIL, canary_first=False)
    sandbox.set_scenario("slow", in_progress_s=20.0)
    sandbox.clock(freeze=True)
    assert _materialize(spec, instance, resources, ["manifest", "quote"]).success
    assert _materialize(spec, instance, resources, ["submissions"], "s00001").success
    sandbox.clock(advance_s=10.0)  # half of the batch's lines are done at the provider
    store = Store(home)
    assert ShardSummaries(spec, store).read("s00001").state == ShardState.SUBMITTED
    # the old rescue closed the live attempt and sent everything online: the state machine refuses that now
    with pytest.raises(IllegalTransition, match="submitted -> abandoned"):
        shard_runner(spec.model_copy(), resources["store"], resources["prices"], spec.tail.backend).run_stream("s00001")
    near = make_job(deadline=(datetime.now(UTC) + timedelta(minutes=20)).isoformat(), tail=TAIL, canary_first=False)
    sandbox.clock(freeze=False)
    assert _materialize(near, instance, resources, ["quote"]).success
    result = _materialize(near, instance, resources, ["submissions"], "s00001")
    assert result.success
    sandbox.clock(advance_s=3600.0)  # a batch that was not really cancelled would finish (and bill) now
    cancels = [r for r in sandbox.requests() if r["method"] == "POST" and r["path"].endswith("/cancel")]
    assert len(cancels) == 1
    results = read_results(store, spec.name, "s00001").filter(pl.col("status") == "succeeded")
    by_pricing = dict(results.group_by("pricing").len().iter_rows())
    assert 0 < by_pricing["batch"] < 10 and by_pricing["batch"] + by_pricing["online"] == 10
    assert results["request_id"].n_unique() == 10  # every item answered once
    ledger = sandbox.ledger()
    batch_billed = [e["custom_id"] for e in ledger if e.get("mode") != "online"]
    online_billed = [e for e in ledger if e.get("mode") == "online"]
    assert len(batch_billed) == len(set(batch_billed)) == by_pricing["batch"]
    assert len(online_billed) == by_pricing["online"]  # only what the cancelled batch had not finished


def test_systemic_codes_inside_a_batch_error_file_stop_the_job_once_without_burning_budgets(
    sandbox, make_job, instance, resources, home
):
    spec = make_job(canary_first=False)
    sandbox.set_scenario("line_errors", rate=0.3, times=1000, code="invalid_api_key")
    with pytest.raises(dg.Failure, match="invalid_api_key") as failure:
        run_job(spec, instance, resources)
    assert (
        failure.value.description.count("request(s) failed with invalid_api_key") == 1
    )  # one message, not one per line
    store = Store(home)
    stop = JobControl(store, spec.name).current()
    assert stop.code == "invalid_api_key"
    creates = batch_creates(sandbox)
    assert creates == 4  # the first pass went out; nothing was resubmitted into the revoked key
    states = JobState.load(spec, store).states
    assert states["failures"].max() == 0 and states.filter(pl.col("state") == "dead_lettered").height == 0
    # the key is fixed: resume sends only what never got an answer
    sandbox.set_scenario("normal")
    JobControl(store, spec.name).clear()
    report = run_job(spec, instance, resources)
    assert report["complete"] and report["succeeded"] == 40
    billed = Counter(ledger_ids(sandbox))
    assert len(billed) == 40 and set(billed.values()) == {1}


def test_a_canary_without_a_golden_set_stops_a_job_whose_answers_break_the_contract(
    sandbox, make_job, instance, resources, home
):
    # every answer is cut off at max_tokens (finish_reason length): a structural failure, as with a max_tokens too
    # small for the answers a model really gives
    rows = [
        {"ticket_id": f"T{i}", "subject": "s", "body": f"ticket {i}: wrong invoice [[sandbox:truncate]]"}
        for i in range(120)
    ]
    spec = make_job(rows=rows, shards={"max_requests": 60}, canary={"size": 12})
    with pytest.raises(dg.Failure, match=r"canary shard s00001 failed: structural failure rate 1\.000"):
        run_job(spec, instance, resources)
    # only the canary was paid for: 12 requests of the 120, as one small batch
    assert batch_creates(sandbox) == 1
    [canary] = AttemptLog(Store(home), spec.name, "s00001").all()
    assert canary.canary and len(canary.request_ids) == 12
    assert JobControl(Store(home), spec.name).current().code == "canary_failed"


def test_the_canary_sample_spreads_over_prompt_lengths(sandbox, make_job, instance, resources, home):
    rows = [{"ticket_id": f"T{i}", "subject": "s", "body": "word " * (1 + i * 3)} for i in range(60)]
    spec = make_job(rows=rows, shards={"max_requests": 60}, canary={"size": 6})
    run_job(spec, instance, resources)
    store = Store(home)
    [canary, *_] = AttemptLog(store, spec.name, "s00001").all()
    items = pl.from_arrow(Manifest(spec.name, store).shard_items("s00001", ["request_id", "est_input_tokens"])).sort(
        "est_input_tokens"
    )
    ranks = sorted(items["request_id"].to_list().index(r) for r in canary.request_ids)
    assert len(ranks) == 6 and ranks[0] < 10 and ranks[-1] >= 50  # short and long prompts both ride in it


def test_an_orphaned_intent_does_not_stall_a_sensor_driven_job(sandbox, make_job, instance, resources, home):
    """A crash between the intent and the submission: the driver resolves it, and the job publishes."""
    spec = make_job(canary_first=False)
    store = Store(home)
    assert _materialize(spec, instance, resources, ["manifest", "quote"]).success
    # what a process killed right after writing its intent leaves behind (the fault campaign does it for real)
    items = Manifest(spec.name, store).shard_items("s00002", ["request_id"]).column("request_id").to_pylist()
    AttemptLog(store, spec.name, "s00002").create_intent(
        1,
        {
            "key": f"{spec.name}:s00002:1",
            "backend": "openai_batch",
            "request_ids": items,
            "requests": len(items),
            "canary": False,
        },
    )
    sensor = build_shard_sensor(spec, build_jobs(spec))
    stages = {
        "submit": ["submissions"],
        "collect": ["shard_results"],
        "quote": ["quote"],
        "publish": ["results", "validated", "dead_letters", "report"],
    }
    published = False
    for _ in range(30):
        out = sensor(dg.build_sensor_context(instance=instance, resources=resources))
        requests = [] if isinstance(out, dg.SkipReason) else list(out)
        for request in requests:
            stage = request.job_name.removeprefix(f"{spec.name}_")
            assert _materialize(spec, instance, resources, stages[stage], request.partition_key, request.tags).success
            published = published or stage == "publish"
        if published:
            break
    assert published, "the job never published"
    assert AttemptLog(store, spec.name, "s00002").all()[0].abandoned  # resolved: nothing at the provider
    billed = Counter(ledger_ids(sandbox))
    assert len(billed) == 40 and set(billed.values()) == {1}
