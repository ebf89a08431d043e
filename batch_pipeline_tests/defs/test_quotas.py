"""A job far bigger than the account's queue finishes by itself (issue 16), through the real openai SDK against the
sandbox's enqueued-token cap: admitted while it fits, waiting while it does not, learning the cap from the
refusal when none was configured, and never paying twice."""

import threading
import time
from collections import Counter

import polars as pl
import pytest

from batch_pipeline.core.ledger.attempts import AttemptLog
from batch_pipeline.core.ledger.capacity import CapacityLedger, CapacityScope, Dimension
from batch_pipeline.core.ledger.reconcile import VALID
from batch_pipeline.core.manifest.read import Manifest
from batch_pipeline.core.publish.tables import JobState
from batch_pipeline.core.store import Store
from batch_pipeline.defs.pipeline import run_job

SHARDS = {"max_requests": 2}  # the 40 sample rows in 20-odd shards


def shard_tokens(spec, home, sandbox) -> dict[str, int]:
    """The sandbox's own count of each shard's prompt tokens, from a run without a cap."""
    run_job(spec, *_fresh(home))
    billed = {e["custom_id"]: e["input_tokens"] for e in sandbox.ledger()}
    index = pl.from_arrow(Manifest(spec.name, Store(home)).item_index(["request_id", "shard_id"]))
    frame = index.with_columns(pl.col("request_id").replace_strict(billed, default=0).alias("tokens"))
    return dict(frame.group_by("shard_id").agg(pl.col("tokens").sum()).iter_rows())


def _fresh(home):
    import dagster as dg

    from batch_pipeline.defs.resources import PricesResource, StoreResource
    from batch_pipeline_tests.defs.conftest import REPO

    return dg.DagsterInstance.ephemeral(), {
        "store": StoreResource(root=str(home)),
        "prices": PricesResource(path=str(REPO / "data" / "prices.yaml")),
    }


def assert_billed_once(spec, home, sandbox) -> None:
    state = JobState.load(spec, Store(home))
    counts = state.check()
    assert counts.valid == counts.expected == 40, counts
    billed = Counter(e["custom_id"] for e in sandbox.ledger())
    valid = set(state.states.filter(pl.col("state") == VALID)["request_id"])
    assert {rid: n for rid, n in billed.items() if rid in valid} == dict.fromkeys(valid, 1)


def peak_tokens(sandbox) -> int:
    return max((e["tokens"] for e in sandbox.load()["events"] if e["provider"] == "openai"), default=0)


def refusals(home, spec) -> list[dict]:
    return [refusal for _, refusal in shard_refusals(home, spec)]


def shard_refusals(home, spec) -> list[tuple[str, dict]]:
    """Each refusal the attempt logs recorded, with its shard."""
    store = Store(home)
    out = []
    for shard in Manifest(spec.name, store).shard_ids():
        for attempt in AttemptLog(store, spec.name, shard).all():
            for record in attempt.records.values():
                if getattr(record, "refused", None) is not None:
                    out.append((shard, record.refused))
    return out


def _thaw_after_creates(sandbox, creates: int, timeout_s: float = 120.0) -> None:
    """Let the sandbox clock run once ``creates`` batch creates arrived (or after ``timeout_s``: the job then
    fails the test's assertions, not hangs)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        made = [r for r in sandbox.requests() if r["method"] == "POST" and r["path"] == "/v1/batches"]
        if len(made) >= creates:
            break
        time.sleep(0.1)
    sandbox.clock(freeze=False)


_SIZES: dict[str, int] = {}  # the sandbox's count of each shard, measured once per module (the same rows and spec)


@pytest.fixture
def cap(sandbox, make_job, tmp_path) -> int:
    """Enqueued tokens that hold the three largest shards at once."""
    if not _SIZES:
        probe = make_job("probe", shards=SHARDS)
        _SIZES.update(shard_tokens(probe, tmp_path / "probe_home", sandbox))
    assert len(_SIZES) >= 20
    sandbox.reset()
    return sum(sorted(_SIZES.values())[-3:])


def test_a_configured_cap_is_never_passed_and_never_refuses(sandbox, make_job, instance, resources, home, cap):
    sandbox.set_scenario("normal", quota_enqueued_tokens=cap, in_progress_s=1.0)
    spec = make_job(
        shards=SHARDS,
        backend={"name": "openai_batch", "settings": {"sandbox": True, "quota": {"enqueued_tokens": cap}}},
    )
    report = run_job(spec, instance, resources)
    assert report["complete"] and report["succeeded"] == 40
    assert_billed_once(spec, home, sandbox)
    load = sandbox.load()
    assert load["refusals"] == 0 and refusals(home, spec) == []  # no token_limit_exceeded at all
    assert 0 < peak_tokens(sandbox) <= cap
    shard_max = cap / 3
    assert peak_tokens(sandbox) > shard_max  # more than one batch was in the queue at once: it was kept filled
    ledger = CapacityLedger(Store(home), CapacityScope("openai_batch", "OPENAI_API_KEY", spec.model))
    assert ledger.snapshot().holdings == ()  # every reservation was released when its batch ended
    # released when a poll saw the batch end, before its collection: the same plan sent a waiting shard
    store = Store(home)
    whys = [store.read_json(p)["why"] for p in store.list_files(ledger.dir, suffix=".released.json")]
    assert "the provider ended the batch" in whys, Counter(whys)


def test_an_unconfigured_cap_is_learned_from_the_refusal_and_the_job_still_finishes(
    sandbox, make_job, instance, resources, home, cap
):
    sandbox.set_scenario("normal", quota_enqueued_tokens=cap, in_progress_s=1.0)
    spec = make_job(shards=SHARDS, canary_first=False)  # no canary: every shard is offered at once
    # the provider's clock stands still until more batches were created than the cap holds: on a loaded machine the
    # creates came slower than a batch ends (1 s), the queue never filled, and nothing was refused
    sandbox.clock(freeze=True)
    thaw = threading.Thread(target=_thaw_after_creates, args=(sandbox, 5), daemon=True)
    thaw.start()
    try:
        report = run_job(spec, instance, resources)
    finally:
        thaw.join(timeout=1)
        sandbox.clock(freeze=False)
    assert report["complete"] and report["succeeded"] == 40  # no job stop
    assert_billed_once(spec, home, sandbox)
    refused = refusals(home, spec)
    assert refused and all(r["code"] == "token_limit_exceeded" for r in refused)
    assert sandbox.load()["refusals"] == len(refused)
    assert peak_tokens(sandbox) <= cap  # a refused batch never counted as load
    ledger = CapacityLedger(Store(home), CapacityScope("openai_batch", "OPENAI_API_KEY", spec.model))
    assert ledger.limits().values[Dimension.TOKENS] == cap  # the limit OpenAI's message states
    # learned: not every shard was refused (how many creates raced the first refusal depends on the machine's load,
    # so the count of refusals is not bounded here; the shards accepted at their first try are)
    shards = Manifest(spec.name, Store(home)).shard_ids()
    assert len({shard for shard, _ in shard_refusals(home, spec)}) < len(shards)


def test_shards_spread_over_the_accounts_that_have_room(sandbox, make_job, instance, resources, home, cap, monkeypatch):
    monkeypatch.setenv("TEAM_A_KEY", "sk-team-a")
    monkeypatch.setenv("TEAM_B_KEY", "sk-team-b")
    each = cap // 2  # one account alone holds about one and a half shards
    sandbox.set_scenario("normal", quota_enqueued_tokens=each, in_progress_s=1.0)
    quota = {"enqueued_tokens": each}
    spec = make_job(
        shards=SHARDS,
        backend={
            "name": "openai_batch",
            "settings": {
                "sandbox": True,
                "accounts": [
                    {"api_key_env": "TEAM_A_KEY", "quota": quota},
                    {"api_key_env": "TEAM_B_KEY", "name": "team-b", "quota": quota},
                ],
            },
        },
    )
    report = run_job(spec, instance, resources)
    assert report["complete"] and report["succeeded"] == 40
    assert_billed_once(spec, home, sandbox)
    load = sandbox.load()
    assert load["refusals"] == 0
    peaks = {p["account"]: p["tokens"] for p in load["peak"] if p["provider"] == "openai"}
    assert len(peaks) == 2 and all(0 < t <= each for t in peaks.values()), peaks  # both used, neither past its cap
    store = Store(home)
    used = {
        a.submitted.account
        for shard in Manifest(spec.name, store).shard_ids()
        for a in AttemptLog(store, spec.name, shard).all()
        if a.submitted
    }
    assert used == {"TEAM_A_KEY", "team-b"}
