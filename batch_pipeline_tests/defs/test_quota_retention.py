"""A batch that completed but was never collected: its age shows against the provider's retention, and once the
provider deleted its results the shard is held for a human (its items were billed) while the rest of the job goes
on; the reconciliation still balances, and `resume` sends the lost items again. Through the real openai SDK
against the sandbox, whose clock deletes output files 30 days after completion."""

import argparse
from datetime import UTC, datetime, timedelta

import dagster as dg
import openai
from rich.console import Console

from batch_pipeline.cli_state import status
from batch_pipeline.core.ledger.attempts import AttemptLog, SubmittedRecord
from batch_pipeline.core.ledger.ceilings import open_batch_ages
from batch_pipeline.core.ledger.control import JobControl
from batch_pipeline.core.manifest.read import Manifest
from batch_pipeline.core.publish.tables import JobState
from batch_pipeline.core.run.summary import ShardSummaries
from batch_pipeline.core.settings import Settings
from batch_pipeline.core.store import Store
from batch_pipeline.defs.assets import SHARDS_TAG, asset_key
from batch_pipeline.defs.build import build_definitions
from batch_pipeline.defs.pipeline import RANGE_END, RANGE_START, run_job
from batch_pipeline.executors.registry import batch_ceilings

DAY = 24 * 3600


def submit_only(spec, instance, resources, shards: list[str]) -> None:
    """Materialize the manifest, the quote and the submissions of ``shards``, and collect nothing."""
    defs = build_definitions([spec], resources)
    assets = list(defs.assets or []) + list(defs.asset_checks or [])

    def run(names, **kwargs):
        result = dg.materialize(
            assets,
            selection=[asset_key(spec, n) for n in names],
            instance=instance,
            resources=defs.resources,
            raise_on_error=False,
            **kwargs,
        )
        assert result.success

    run(["manifest"])
    run(["quote"])
    ids = Manifest(spec.name, Store(resources["store"].root)).shard_ids()
    if shards:
        run(["submissions"], tags={RANGE_START: ids[0], RANGE_END: ids[-1], SHARDS_TAG: ",".join(shards)})


def status_text(spec, home) -> str:
    console = Console(record=True, width=400)
    assert (
        status(spec, argparse.Namespace(settings=Settings().with_home(str(home)), all=False, check=False), console) == 0
    )
    return console.export_text()


def test_open_batches_are_aged_against_their_providers_ceilings(make_job, monkeypatch):
    monkeypatch.setenv("BATCH_PIPELINE_SANDBOX_URL", "http://127.0.0.1:9")
    openai = batch_ceilings(make_job("o").backend)
    anthropic = batch_ceilings(
        make_job(
            "a", backend={"name": "anthropic_batch", "settings": {"sandbox": True}}, model="claude-haiku-4-5"
        ).backend
    )
    at = datetime(2026, 11, 1, tzinfo=UTC)
    submitted = SubmittedRecord(backend="openai_batch", batch_id="batch_1", key="j:s00001:1", at=at.isoformat())
    (fresh,) = open_batch_ages([("s00001", submitted)], openai, "j", now=at + timedelta(hours=2))
    assert fresh.warning is None and fresh.expires_at == at + timedelta(hours=24)
    (late,) = open_batch_ages([("s00001", submitted)], openai, "j", now=at + timedelta(hours=20))
    assert "completion window" in late.warning
    (old,) = open_batch_ages([("s00001", submitted)], openai, "j", now=at + timedelta(days=25))
    assert "deletes its results 30.0 days after it completed" in old.warning and "collect it now" in old.warning
    (gone,) = open_batch_ages([("s00001", submitted)], anthropic, "j", now=at + timedelta(days=29, hours=1))
    assert "29.0 days after it was created, which has passed" in gone.warning


def test_results_lost_to_retention_hold_their_shard_and_the_rest_finishes(sandbox, make_job, instance, resources, home):
    spec = make_job(canary_first=False)
    store = Store(home)
    submit_only(spec, instance, resources, shards=[])  # manifest and quote only
    shards = Manifest(spec.name, store).shard_ids()
    lost, kept = shards[0], shards[1:]
    submit_only(spec, instance, resources, shards=[lost])
    client = openai.OpenAI(base_url=sandbox.base_url.rstrip("/") + "/v1", api_key="sk-sandbox")
    deadline = datetime.now(UTC) + timedelta(seconds=60)
    while not any(b.status == "completed" for b in client.batches.list()):  # the provider finishes it
        assert datetime.now(UTC) < deadline
    sandbox.clock(advance_s=31 * DAY)  # and deletes its output 30 days later; nobody collected it
    report = run_job(spec, instance, resources)
    assert not report["complete"]  # the held shard's items are not answered ...
    held = JobControl(store, spec.name).shard_holds()
    assert list(held) == [lost] and "deleted by the provider" in held[lost] and "resume" in held[lost]
    summaries = {s.shard_id: s for s in ShardSummaries(spec, store).all()}
    assert all(summaries[s].valid == summaries[s].expected for s in kept)  # ... and the rest of the job finished
    counts = JobState.load(spec, store).check()  # balanced: the lost items are missing, counted once
    assert counts.balanced and counts.missing == summaries[lost].expected
    attempt = AttemptLog(store, spec.name, lost).all()[-1]
    assert attempt.collected.state == "lost"
    assert report["held_shards"] == held
    out = status_text(spec, home)
    assert f"shard {lost} held: batch" in out and "resume" in out and "shard held" in out  # why, and the fix
    billed_before = len(sandbox.ledger())
    JobControl(store, spec.name).release_holds()  # what `resume` does: a human chose to pay again
    report = run_job(spec, instance, resources)
    assert report["complete"] and report["succeeded"] == counts.expected
    assert len(sandbox.ledger()) == billed_before + summaries[lost].expected  # only the lost items, once more
