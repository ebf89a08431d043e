"""Attempt records written before they were typed (dicts without ``version``) still read, as version 1."""

from batch_pipeline.core.ledger.attempts import ATTEMPT_VERSION, AttemptLog, SubmittedRecord
from batch_pipeline.core.ledger.executor import BatchHandle
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store

PATHS = JobPaths("j")
# each event exactly as the runner, the collector, the stream runner and the sweep wrote it before
BEFORE = {
    (1, "intent"): {
        "key": "j:s00001:1",
        "backend": "openai_batch",
        "lease_token": 3,
        "request_ids": ["a", "b"],
        "requests": 2,
        "canary": True,
        "stage": "primary",
        "capacity": None,
        "account": None,
        "at": "2026-12-01T10:00:00.000001+00:00",
    },
    (1, "submitted"): {
        "backend": "openai_batch",
        "batch_id": "batch_1",
        "key": "j:s00001:1",
        "input_file_id": "file-1",
        "at": "2026-12-01T10:00:01.000001+00:00",
    },
    (1, "collected"): {
        "state": "completed",
        "rows": 2,
        "succeeded": 1,
        "systemic": None,
        "provider_counts": {"total": 2, "completed": 2, "failed": 0},
        "at": "2026-12-01T11:00:00.000001+00:00",
    },
    (1, "discarded"): {
        "backend": "openai_batch",
        "batch_id": "batch_1",
        "deleted": ["file-1", "file-out-1"],
        "at": "2026-12-01T11:00:02.000001+00:00",
    },
    (2, "intent"): {
        "key": "j:s00001:2",
        "backend": "online",
        "lease_token": 4,
        "request_ids": ["b"],
        "requests": 1,
        "canary": False,
        "stage": "fallback",
        "capacity": 7,
        "account": "second",
        "at": "2026-12-01T12:00:00.000001+00:00",
    },
    (2, "abandoned"): {
        "reason": "interrupted; flushed and journalled results kept",
        "possibly_billed": 1,
        "possibly_billed_usd": 0.00012,
        "at": "2026-12-01T12:00:05.000001+00:00",
    },
    (3, "intent"): {"key": "j:s00001:3", "request_ids": ["b"], "at": "2026-12-01T13:00:00+00:00"},  # oldest shape
    (3, "abandoned"): {
        "reason": "refused by the provider: tokens",
        "refused": {"dimension": "tokens", "limit": 90000, "code": "rate_limit"},
        "at": "2026-12-01T13:00:01+00:00",
    },
}


def test_attempt_records_written_before_versions_read_as_version_1(tmp_path):
    store = Store(tmp_path)
    for (number, event), record in BEFORE.items():
        store.write_json(PATHS.attempt_event("s00001", number, event), record)
    first, second, third = AttemptLog(store, "j", "s00001").all()
    assert all(r.version == 1 == ATTEMPT_VERSION for a in (first, second, third) for r in a.records.values())
    assert (first.key, first.request_ids, first.canary, first.backend) == (
        "j:s00001:1",
        ["a", "b"],
        True,
        "openai_batch",
    )
    assert first.submitted is not None and first.closed and not first.open
    assert first.submitted.handle() == BatchHandle("openai_batch", "batch_1", "j:s00001:1", "file-1")
    assert first.collected is not None and (first.collected.state, first.collected.rows) == ("completed", 2)
    assert first.discarded is not None and first.discarded.deleted == ["file-1", "file-out-1"]
    assert second.intent.stage == "fallback" and second.intent.capacity == 7 and second.intent.account == "second"
    assert second.abandoned is not None and second.abandoned.possibly_billed_usd == 0.00012
    assert third.backend is None and not third.canary and third.intent.stage == "primary"
    assert third.abandoned is not None and third.abandoned.refused == {
        "dimension": "tokens",
        "limit": 90000,
        "code": "rate_limit",
    }


def test_an_event_written_now_keeps_the_writer_s_keys_and_adds_the_version(tmp_path):
    store = Store(tmp_path)
    log = AttemptLog(store, "j", "s00001")
    log.create_intent(1, {"key": "j:s00001:1", "request_ids": ["a"], "backend": "online"})
    log.record(1, "submitted", {**SubmittedRecord(backend="x", batch_id="b", key="k").handle().as_dict(), "note": 1})
    stored = store.read_json(PATHS.attempt_event("s00001", 1, "submitted"))
    assert set(stored) == {"backend", "batch_id", "key", "input_file_id", "note", "version", "at"}
    assert log.all()[0].submitted.model_extra == {"note": 1}  # a key no record names is kept, not dropped
