"""A shard summary written before it carried a version still reads, as version 1, and writes back the same."""

from batch_pipeline.core.ledger.machine import ShardState
from batch_pipeline.core.run.summary import SUMMARY_VERSION, ShardSummary

# exactly as ShardSummary.as_dict wrote it before (dataclasses.asdict, the state as its value)
BEFORE = {
    "shard_id": "s00002",
    "state": "submitted",
    "expected": 10,
    "valid": 4,
    "invalid": 1,
    "missing": 5,
    "dead_lettered": 0,
    "attempts": 2,
    "spend_usd": 0.0001234,
    "canary_done": True,
    "last_final_state": "completed",
    "first_try_cost": 0.0001,
    "first_tries": 10,
    "retry_cost": 2.34e-05,
    "retry_tries": 6,
    "fallback_pending": 0,
    "fallback_valid": 0,
    "pending_est_tokens": 1520,
    "possibly_billed_usd": 0.0,
    "open": {
        "number": 2,
        "key": "j:s00002:2",
        "backend": "openai_batch",
        "intent_at": "2026-12-01T10:00:00.000001+00:00",
        "canary": False,
        "submitted": {
            "backend": "openai_batch",
            "batch_id": "batch_2",
            "key": "j:s00002:2",
            "input_file_id": "file-2",
            "at": "2026-12-01T10:00:01.000001+00:00",
        },
        "stage": "primary",
    },
    "updated_at": "2026-12-01T10:00:01.500001+00:00",
}


def test_a_summary_written_before_versions_reads_as_version_1():
    summary = ShardSummary.from_dict(BEFORE)
    assert summary.version == 1 == SUMMARY_VERSION and summary.state is ShardState.SUBMITTED
    assert summary.retryable == 6 and summary.balanced
    assert summary.open is not None and summary.open.submitted is not None
    assert summary.open.submitted.handle().batch_id == "batch_2"
    again = summary.as_dict()
    assert {k: v for k, v in again.items() if k not in ("version", "open")} == {
        k: v for k, v in BEFORE.items() if k != "open"
    }
    assert again["open"]["submitted"]["batch_id"] == "batch_2" and again["version"] == 1
    assert ShardSummary.from_dict(again) == summary


def test_a_summary_with_keys_this_release_does_not_know_still_reads():
    assert ShardSummary.from_dict({**BEFORE, "open": None, "a_newer_count": 3}).open is None
