"""The capacity ledger on a real store: reservations fit or wait, racing writers never pass the cap, dead ones are
released, limits are configured or learned."""

import multiprocessing
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from batch_pipeline.core.ledger.admission import Room, Verdict, decide, fitting_prefix
from batch_pipeline.core.ledger.capacity import CapacityLedger, CapacityScope, Dimension, Need, stated_limit
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.spec.quota import QuotaSpec
from batch_pipeline.core.store import Store

SCOPE = CapacityScope("openai_batch", "OPENAI_API_KEY", "gpt-4o-mini")


def ledger(tmp_path, **quota) -> CapacityLedger:
    return CapacityLedger(Store(tmp_path / "home"), SCOPE, QuotaSpec(**quota))


def intent(store: Store, job: str, shard: str, attempt: int, event: str = "intent") -> None:
    store.write_json(JobPaths(job).attempt_event(shard, attempt, event), {"at": datetime.now(UTC).isoformat()})


def test_a_reservation_fits_or_waits_and_the_snapshot_names_the_holders(tmp_path):
    book = ledger(tmp_path, enqueued_tokens=1000)
    assert book.reserve("triage", "s1", 1, Need(600, 10)) is not None
    assert book.reserve("embed", "s1", 1, Need(300, 10)) is not None
    assert book.reserve("triage", "s2", 1, Need(200, 10)) is None  # 1,100 > 1,000
    snap = book.snapshot(sweep=False)
    assert snap.in_use(Dimension.TOKENS) == 900 and snap.free(Dimension.TOKENS) == 100
    text = snap.describe(Dimension.TOKENS)
    assert "900 of 1k enqueued tokens in use by 2 batch(es) (jobs embed, triage)" in text, text
    assert book.reserve("triage", "s2", 1, Need(100, 10)) is not None  # exactly at the cap fits


def test_a_forced_reservation_holds_a_batch_already_at_the_provider(tmp_path):
    book = ledger(tmp_path, concurrent_jobs=1)
    assert book.reserve("j", "s1", 1, Need()) is not None
    assert book.reserve("j", "s2", 1, Need()) is None
    assert book.reserve("j", "s2", 1, Need(), force=True) is not None
    assert book.snapshot(sweep=False).in_use(Dimension.JOBS) == 2


def _race(root: str, worker: int, out) -> None:
    book = CapacityLedger(Store(root), SCOPE, QuotaSpec(concurrent_jobs=7))
    got = sum(book.reserve("race", f"w{worker}-{i}", 1, Need()) is not None for i in range(6))
    out.put(got)


def test_racing_processes_never_pass_the_cap(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_race, args=(str(tmp_path / "home"), w, out)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert sum(out.get(timeout=5) for _ in procs) == 7
    assert ledger(tmp_path, concurrent_jobs=7).snapshot(sweep=False).in_use(Dimension.JOBS) == 7


def test_released_and_dead_reservations_free_their_room(tmp_path):
    book = ledger(tmp_path, enqueued_requests=30)
    store = book.store
    closed = book.reserve("j", "s1", 1, Need(0, 10))
    submitted = book.reserve("j", "s2", 1, Need(0, 10))
    orphan = book.reserve("j", "s3", 1, Need(0, 10))
    assert closed and submitted and orphan
    intent(store, "j", "s1", 1)
    intent(store, "j", "s1", 1, "collected")  # the batch ended: its holder may have died before releasing
    intent(store, "j", "s2", 1)
    intent(store, "j", "s2", 1, "submitted")  # accepted and recorded, the bind interrupted: still held
    live = {h.shard_id for h in book.snapshot().holdings}
    assert live == {"s2", "s3"}
    later = CapacityLedger(store, SCOPE, QuotaSpec(enqueued_requests=30), hold_ttl=timedelta(seconds=0))
    live = {h.shard_id for h in later.snapshot().holdings}
    assert live == {"s2"}  # s3 never got a batch within the ttl; s2 holds until its batch ends
    book.release_attempt("j", "s2", 1, "batch completed")
    assert book.snapshot().holdings == ()


def test_a_refusal_teaches_the_stated_limit_or_the_load(tmp_path):
    book = ledger(tmp_path)
    assert not book.limits().any
    assert book.learn(Dimension.TOKENS, 2_000_000, load=1_500_000) == 2_000_000
    book.clean_submission()
    assert book.limits().values[Dimension.TOKENS] == 2_000_000  # a stated limit is exact: it does not drift
    assert book.learn(Dimension.REQUESTS, None, load=400) == 400
    for _ in range(3):
        book.clean_submission()
    assert 400 < book.limits().values[Dimension.REQUESTS] < 500  # rises slowly after clean submissions
    capped = CapacityLedger(book.store, SCOPE, QuotaSpec(enqueued_requests=420))
    for _ in range(20):
        capped.clean_submission()
    assert capped.limits().values[Dimension.REQUESTS] == 420  # never above the configured figure


@pytest.mark.parametrize(
    "message, limit",
    [
        (
            "Enqueued token limit reached for gpt-4o-mini in organization org-x. Limit: 2,000,000 enqueued tokens. "
            "Please try again once some in_progress batches have been completed.",
            2_000_000,
        ),
        ("Number of requests in the processing queue exceeds the limit: 100000 requests", 100_000),
        ("Quota exceeded for concurrent jobs, limit: 4", 4),
        ("try again later", None),
    ],
)
def test_stated_limits_are_parsed_from_the_providers_messages(message, limit):
    assert stated_limit(message) == limit


def test_admission_sends_whole_in_part_or_waits(tmp_path):
    book = ledger(tmp_path, enqueued_tokens=1000, concurrent_jobs=3)
    snap = book.snapshot()
    assert decide(snap, Need(400, 4)) == (Verdict.FULL, None)
    assert decide(snap, Need(5000, 50)) == (Verdict.PARTIAL, None)  # bigger than the whole cap: sent in parts
    book.reserve("j", "a", 1, Need(850, 5))
    snap = book.snapshot()
    assert decide(snap, Need(400, 4)) == (Verdict.WAIT, Dimension.TOKENS)  # 150 free: not worth a batch
    tokens = np.full(50, 100)
    assert fitting_prefix(snap, tokens) == 1  # 5,000 > the cap: the part that fits goes
    room = Room([book.snapshot()])
    assert room.admit(Need(100, 1)) is None
    why = room.admit(Need(100, 1))
    assert why is not None and why.startswith("quota: 850 of 1k enqueued tokens in use by 1 batch(es)")
    book.reserve("j", "b", 1, Need(0, 0))
    book.reserve("j", "c", 1, Need(0, 0))
    assert decide(book.snapshot(), Need(10, 1)) == (Verdict.WAIT, Dimension.JOBS)
