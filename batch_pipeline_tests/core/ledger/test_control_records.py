"""Stop, pause and hold records written before they were typed (dicts without ``version``) still read, as
version 1, and still hold the job."""

import pytest

from batch_pipeline.core.errors import SystemicError
from batch_pipeline.core.ledger.control import CONTROL_VERSION, JobControl, JobPaused
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store

PATHS = JobPaths("j")

# exactly as JobControl wrote them before the records were typed
STOP_BEFORE = {"reason": "invalid API key", "code": "invalid_api_key", "at": "2026-12-01T10:00:00.000001+00:00"}
PAUSE_BEFORE = {"reason": "deploy", "at": "2026-12-01T10:05:00.000001+00:00"}
HOLD_BEFORE = {"reason": "results lost at the provider", "at": "2026-12-01T10:06:00.000001+00:00"}


def test_records_written_before_versions_read_as_version_1(tmp_path):
    store = Store(tmp_path)
    store.write_json(PATHS.stop, STOP_BEFORE)
    store.write_json(PATHS.pause, PAUSE_BEFORE)
    store.write_json("jobs/j/holds/s00002.json", HOLD_BEFORE)
    control = JobControl(store, "j")
    stop, pause = control.current(), control.paused()
    assert stop is not None and stop.version == 1
    assert (stop.reason, stop.code, stop.at) == ("invalid API key", "invalid_api_key", STOP_BEFORE["at"])
    assert pause is not None and (pause.version, pause.reason, pause.at) == (1, "deploy", PAUSE_BEFORE["at"])
    assert control.shard_holds() == {"s00002": "results lost at the provider"}
    assert CONTROL_VERSION == 1
    with pytest.raises(JobPaused, match="paused since 2026-12-01T10:05"):
        control.ensure_running()
    control.unpause()
    with pytest.raises(SystemicError, match="invalid API key") as raised:
        control.ensure_running()
    assert raised.value.code == "invalid_api_key"


def test_records_written_now_carry_their_version_and_the_same_keys(tmp_path):
    store = Store(tmp_path)
    control = JobControl(store, "j")
    control.stop("budget crossed", code="budget")
    control.pause()
    assert set(store.read_json(PATHS.stop)) == {*STOP_BEFORE, "version"}
    assert store.read_json(PATHS.pause)["reason"] == "paused"


def test_an_unreadable_stop_still_stops_the_job(tmp_path):
    store = Store(tmp_path)
    store.write_json(PATHS.stop, {"code": "budget"})  # no reason: not a record any release wrote
    with pytest.raises(SystemicError, match="unreadable record"):
        JobControl(store, "j").ensure_running()
