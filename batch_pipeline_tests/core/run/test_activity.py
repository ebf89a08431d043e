"""What a run did, from the attempt log: counts that add up, and every kind of action named."""

from batch_pipeline.core.ledger.attempts import AttemptLog
from batch_pipeline.core.run.activity import Activity
from batch_pipeline.core.store import Store

JOB = "act"


def _intent(log: AttemptLog, n: int, backend: str = "openai_batch", **extra) -> None:
    assert log.create_intent(n, {"key": f"k{n}", "backend": backend, "request_ids": [], **extra})


def test_a_run_s_counts_add_up_and_name_batches_of_earlier_runs_and_online_answers(tmp_path):
    store = Store(tmp_path)
    s1, s2, s3 = (AttemptLog(store, JOB, s) for s in ("s00001", "s00002", "s00003"))
    _intent(s1, 1)
    s1.record(
        1, "submitted", {"backend": "openai_batch", "key": "k1", "batch_id": "b1"}
    )  # an earlier run sent this batch
    activity = Activity(store, JOB, tail_backend="online")
    assert not activity.since().anything and activity.since().describe() == "nothing sent or collected"

    s1.record(1, "collected", {"state": "completed", "rows": 10})  # collected in this run
    _intent(s2, 1)
    s2.record(
        1, "submitted", {"backend": "openai_batch", "key": "k1", "batch_id": "b2"}
    )  # sent in this run, still open
    _intent(s3, 1)
    s3.record(
        1, "submitted", {"backend": "openai_batch", "key": "k1", "batch_id": "b3", "reattached": True}
    )  # an orphaned intent, found (resolve)
    s3.record(1, "collected", {"state": "expired", "rows": 4})
    _intent(s3, 2, backend="online")  # the rest rescued online
    s3.record(2, "collected", {"state": "completed", "rows": 6})
    _intent(s2, 2, backend="openai_batch")
    s2.record(2, "abandoned", {"reason": "refused by the provider"})
    did = activity.since()
    assert (did.sent, did.reattached, did.collected, did.collected_earlier, did.open, did.closed) == (1, 1, 2, 1, 1, 1)
    # sent + re-attached + sent earlier = collected + still open
    assert did.sent + did.reattached + did.collected_earlier == did.collected + did.open
    assert did.describe() == (
        "1 batch(es) sent, 1 re-attached, 2 collected (1 sent by an earlier run; 1 still "
        "open); 1 shard run(s) rescued on online (6 answers); 1 attempt(s) closed with nothing "
        "more sent"
    )


def test_a_stream_backend_s_shards_are_answered_inline_not_collected_batches(tmp_path):
    store = Store(tmp_path)
    activity = Activity(store, JOB)
    log = AttemptLog(store, JOB, "s00001")
    _intent(log, 1, backend="vllm")
    log.record(1, "collected", {"state": "completed", "rows": 40})
    did = activity.since()
    assert (did.sent, did.collected) == (0, 0)
    assert did.describe() == "1 shard run(s) answered inline on vllm (40 answers)"
