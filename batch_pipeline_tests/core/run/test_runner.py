"""The shard runner and the attempt log over a real store and manifest.

The provider is an in-memory stand-in implementing the ``BatchExecutor`` protocol (a test double of the
*provider*, not of our code); the HTTP sandbox covers the real SDK paths in the executors tests.
"""

import logging
from collections.abc import Callable, Iterator
from datetime import date

import polars as pl
import pyarrow as pa
import pytest

from batch_pipeline.core.errors import SystemicError
from batch_pipeline.core.ledger.attempts import AttemptLog
from batch_pipeline.core.ledger.control import JobControl
from batch_pipeline.core.ledger.executor import BatchExecutor, BatchHandle, BatchState, BatchStatus, ShardWork
from batch_pipeline.core.ledger.reconcile import DEAD, INVALID, MISSING, VALID, check_invariant, item_states
from batch_pipeline.core.ledger.result_parts import read_results
from batch_pipeline.core.manifest.shards import Manifest, build_manifest
from batch_pipeline.core.pricing.cost import Price
from batch_pipeline.core.run.runner import STATE_COLUMNS, ShardRunner
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline_tests.core.helpers import base_spec_dict, raw_results, write_jsonl, write_spec

PRICE = Price(input_per_mtok=1.0, output_per_mtok=2.0, batch_discount=0.5, checked=date(2026, 1, 1))


class MemoryProvider:
    """A provider batch API in memory. ``behaviour(prompt, n)`` -> raw row fields for the n-th time a prompt
    is sent, or None for "no result line"."""

    name = "memory"
    pricing = "batch"
    poll_interval_s = 0.0
    max_requests_per_batch = 50_000
    max_bytes_per_batch = 200 * 2**20

    def __init__(self, behaviour: Callable[[str, int], dict | None], final_state: BatchState = BatchState.COMPLETED):
        self.behaviour, self.final_state = behaviour, final_state
        self.batches: dict[str, dict] = {}
        self.sent: dict[str, int] = {}
        self.fail_submit_with: Exception | None = None

    def submit(self, work: ShardWork) -> BatchHandle:
        if self.fail_submit_with is not None:
            raise self.fail_submit_with
        bid = f"batch_{len(self.batches) + 1}"
        rows = []
        for rid, prompt in zip(
            work.items.column("request_id").to_pylist(), work.items.column("user_prompt").to_pylist()
        ):
            self.sent[prompt] = self.sent.get(prompt, 0) + 1
            out = self.behaviour(prompt, self.sent[prompt])
            if out is not None:
                rows.append({"request_id": rid, **out})
        self.batches[bid] = {"key": work.key, "rows": rows, "n": work.items.num_rows}
        return BatchHandle(self.name, bid, work.key)

    def poll(self, handle: BatchHandle) -> BatchStatus:
        b = self.batches[handle.batch_id]
        return BatchStatus(self.final_state, self.final_state.value, total=b["n"], completed=len(b["rows"]))

    def fetch(self, handle: BatchHandle) -> Iterator[pa.Table]:
        rows = self.batches[handle.batch_id]["rows"]
        half = len(rows) // 2
        for chunk in (rows[:half], rows[half:]):  # two flushes
            yield raw_results(chunk)

    def cancel(self, handle: BatchHandle) -> None:
        pass

    def find(self, key: str, request_ids=None, not_before=None) -> BatchHandle | None:
        for bid, b in self.batches.items():
            if b["key"] == key:
                return BatchHandle(self.name, bid, key)
        return None


def answer(label="billing", tokens=(100, 0, 2)):
    return {
        "http_status": 200,
        "output_text": label,
        "finish_reason": "stop",
        "input_tokens": tokens[0],
        "cached_tokens": tokens[1],
        "output_tokens": tokens[2],
    }


def behaviour(prompt: str, n: int) -> dict | None:
    """good: valid at once; flaky: 5xx first, then valid; poison: always 400; junk: never a label; silent: no line
    on the first try."""
    if "poison" in prompt:
        return {"http_status": 400, "error_code": "context_length_exceeded", "error_message": "too long"}
    if "flaky" in prompt and n == 1:
        return {"http_status": 500, "error_code": "server_error"}
    if "junk" in prompt:
        return answer("no idea")
    if "silent" in prompt and n == 1:
        return None
    return answer()


@pytest.fixture
def job(tmp_path):
    kinds = ["good"] * 6 + ["flaky", "poison", "junk", "silent"]
    rows = [{"id": f"k{i}", "body": f"{kind} ticket {i}"} for i, kind in enumerate(kinds)]
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    spec = write_spec(tmp_path / "job", base_spec_dict(str(path), retries={"per_item": 2, "spend_cap_share": 1.0}))
    store = Store(tmp_path / "store")
    summary = build_manifest(spec, store)
    assert summary.new_shards == ["s00001"]
    return spec, store


def states(spec, store, shard="s00001") -> dict[str, str]:
    items = pl.from_arrow(Manifest(spec.name, store).shard_items(shard, ["request_id", "shard_id", "user_prompt"]))
    results = read_results(store, spec.name, shard, STATE_COLUMNS)
    st = item_states(items, results, spec.retries)
    check_invariant(items.select("request_id", "shard_id"), results, st)
    prompt_of = dict(zip(items["request_id"], items["user_prompt"]))
    return {prompt_of[r].split("\n")[1]: s for r, s in zip(st["request_id"], st["state"])}


def kinds_in(states_: dict[str, str], state: str) -> list[str]:
    return sorted(k.split()[0] for k, v in states_.items() if v == state)


def test_submit_collect_resume_until_only_dead_letters_remain(job, caplog):
    spec, store = job
    caplog.set_level(logging.INFO, logger="batch_pipeline.core.run")
    provider = MemoryProvider(behaviour)
    assert isinstance(provider, BatchExecutor)
    runner = ShardRunner(spec, store, provider, PRICE)

    first = runner.submit("s00001")
    assert (first.attempt, first.requests, first.reattached) == (1, 10, False)
    out = runner.collect("s00001", poll_interval_s=0)
    assert (out.attempts, out.rows, out.succeeded) == ([1], 9, 6)
    assert any("9 results stored (6 succeeded)" in r.getMessage() for r in caplog.records)  # progress for the log
    s = states(spec, store)
    assert kinds_in(s, VALID) == ["good"] * 6
    assert kinds_in(s, INVALID) == ["junk"]
    assert kinds_in(s, MISSING) == ["flaky", "silent"]
    assert kinds_in(s, DEAD) == ["poison"]  # retries.poison defaults to 1: a poison item is not retried

    second = runner.submit("s00001")
    assert (second.attempt, second.requests) == (2, 3)  # valid and dead items are never sent again
    runner.collect("s00001", poll_interval_s=0)
    s = states(spec, store)
    assert kinds_in(s, VALID) == ["flaky"] + ["good"] * 6 + ["silent"]
    assert kinds_in(s, DEAD) == ["junk", "poison"]  # junk: retried once (retries.invalid_output 2), then dead

    third = runner.submit("s00001")
    assert third.nothing_to_do and third.requests == 0
    assert len(provider.batches) == 2
    assert sum(provider.sent.values()) == 13

    # cost is recorded per attempt from the provider's token counts
    results = read_results(store, spec.name, "s00001")
    ok = results.filter(pl.col("status") == "succeeded")
    assert ok["cost_usd"].to_list() == pytest.approx([PRICE.cost(100, 2, 0, batch=True)] * 8)
    log = AttemptLog(store, spec.name, "s00001").all()
    assert [(a.number, a.closed, a.collected.rows) for a in log] == [(1, True, 9), (2, True, 3)]


def test_an_open_submitted_attempt_is_reattached_not_resubmitted(job):
    spec, store = job
    provider = MemoryProvider(behaviour)
    runner = ShardRunner(spec, store, provider, PRICE)
    first = runner.submit("s00001")
    again = runner.submit("s00001")  # e.g. a second run before the collect
    assert again.reattached and again.attempt == first.attempt and again.handle == first.handle
    assert len(provider.batches) == 1


def test_crash_between_accepted_and_recorded_reattaches_by_key(job, tmp_path):
    """The provider accepted attempt 1 but the 'submitted' record was never written."""
    spec, store = job
    provider = MemoryProvider(behaviour)
    runner = ShardRunner(spec, store, provider, PRICE)
    runner.submit("s00001")
    paths = JobPaths(spec.name)
    store.delete(paths.attempt_event("s00001", 1, "submitted"))
    assert AttemptLog(store, spec.name, "s00001").all()[0].submitted is None

    outcome = runner.submit("s00001")
    assert outcome.reattached and outcome.attempt == 1 and outcome.handle.batch_id == "batch_1"
    assert len(provider.batches) == 1  # never paid twice
    assert store.read_json(paths.attempt_event("s00001", 1, "submitted"))["reattached"] is True
    runner.collect("s00001", poll_interval_s=0)
    assert kinds_in(states(spec, store), VALID) == ["good"] * 6


def test_intent_without_a_provider_batch_is_abandoned_and_retried(job):
    spec, store = job
    provider = MemoryProvider(behaviour)
    provider.fail_submit_with = SystemicError("invalid api key", code="invalid_api_key")
    runner = ShardRunner(spec, store, provider, PRICE)
    with pytest.raises(SystemicError):
        runner.submit("s00001")
    [attempt] = AttemptLog(store, spec.name, "s00001").all()
    assert attempt.open and attempt.submitted is None and len(attempt.request_ids) == 10

    # the systemic failure stopped the whole job once; the next submit refuses until the cause is fixed
    with pytest.raises(SystemicError, match="is stopped since"):
        runner.submit("s00001")
    provider.fail_submit_with = None
    assert JobControl(store, spec.name).clear().code == "invalid_api_key"  # the user resumes
    outcome = runner.submit("s00001")
    assert outcome.attempt == 2 and outcome.requests == 10 and not outcome.reattached
    log = AttemptLog(store, spec.name, "s00001").all()
    assert "abandoned" in log[0].records and log[0].closed
    assert log[1].open and log[1].submitted.batch_id == "batch_1"


def test_recollecting_an_attempt_changes_nothing(job):
    """A crash after the results were written but before 'collected': the same batch is ingested again."""
    spec, store = job
    provider = MemoryProvider(behaviour)
    runner = ShardRunner(spec, store, provider, PRICE)
    runner.submit("s00001")
    runner.collect("s00001", poll_interval_s=0)
    before = states(spec, store)
    n_before = read_results(store, spec.name, "s00001").height
    store.delete(JobPaths(spec.name).attempt_event("s00001", 1, "collected"))
    out = runner.collect("s00001", poll_interval_s=0)
    assert out.attempts == [1]
    assert read_results(store, spec.name, "s00001").height == n_before == 9
    assert states(spec, store) == before


def test_results_for_unknown_ids_are_ignored(job):
    spec, store = job

    class Chatty(MemoryProvider):
        def fetch(self, handle):
            yield from super().fetch(handle)
            yield raw_results([{"request_id": "f" * 64, **answer()}])

    runner = ShardRunner(spec, store, Chatty(behaviour), PRICE)
    runner.submit("s00001")
    out = runner.collect("s00001", poll_interval_s=0)
    assert out.rows == 9
    assert "f" * 64 not in read_results(store, spec.name)["request_id"].to_list()


def test_failed_batch_stops_with_a_systemic_error(job):
    spec, store = job
    runner = ShardRunner(spec, store, MemoryProvider(behaviour, final_state=BatchState.FAILED), PRICE)
    runner.submit("s00001")
    with pytest.raises(SystemicError, match="failed at the provider"):
        runner.collect("s00001", poll_interval_s=0)
    assert AttemptLog(store, spec.name, "s00001").all()[0].closed
    assert read_results(store, spec.name, "s00001").height == 0


def test_expired_batch_keeps_partial_results_and_the_rest_stays_pending(job):
    spec, store = job

    def expire_half(prompt, n):
        if n == 1 and ("ticket 1" in prompt or "ticket 3" in prompt):
            return {"http_status": None, "error_code": "batch_expired"}
        return behaviour(prompt, n)

    runner = ShardRunner(spec, store, MemoryProvider(expire_half, final_state=BatchState.EXPIRED), PRICE)
    runner.submit("s00001")
    runner.collect("s00001", poll_interval_s=0)
    runner.submit("s00001")
    runner.collect("s00001", poll_interval_s=0)
    s = states(spec, store)
    assert s["good ticket 1"] == s["good ticket 3"] == VALID  # expiry did not spend their budget
    items = read_results(store, spec.name, "s00001", STATE_COLUMNS)
    expired = items.filter(pl.col("error_code") == "batch_expired")
    assert expired.height == 2


def test_attempt_log_ignores_torn_records_and_numbers_attempts(tmp_path):
    store = Store(tmp_path)
    log = AttemptLog(store, "job", "s1")
    assert log.next_number() == 1 and log.all() == []
    log.record(1, "intent", {"key": "job:s1:1", "request_ids": ["a", "b"]})
    log.record(1, "submitted", {"backend": "x", "batch_id": "b1", "key": "job:s1:1"})
    log.record(2, "intent", {"key": "job:s1:2", "request_ids": ["b"]})
    path = store.local_path(JobPaths("job").attempt_event("s1", 2, "submitted"))
    path.write_bytes(b'{"backend": "x", "batch')  # torn
    attempts = log.all()
    assert [a.number for a in attempts] == [1, 2]
    assert attempts[0].submitted.batch_id == "b1" and attempts[0].open and attempts[0].key == "job:s1:1"
    assert attempts[1].submitted is None and attempts[1].request_ids == ["b"]
    assert log.next_number() == 3
    log.record(1, "collected", {"state": "completed", "rows": 2})
    assert log.all()[0].closed and not log.all()[0].open


@pytest.mark.parametrize(("share", "stops"), [(0.1, True), (0.35, False)])
def test_the_retry_spend_cap_stops_a_resubmission_that_would_pass_it(tmp_path, share, stops):
    """First pass: 10 items, 3 of them fail at a cost to their budget. Retrying them costs about 3/10 of the
    first pass: a cap of 10% stops the job before the second batch, one of 35% lets it go."""
    kinds = ["good"] * 6 + ["flaky", "poison", "junk", "silent"]
    path = write_jsonl(tmp_path / "in.jsonl", [{"id": f"k{i}", "body": f"{k} ticket {i}"} for i, k in enumerate(kinds)])
    spec = write_spec(tmp_path / "job", base_spec_dict(str(path), retries={"per_item": 3, "spend_cap_share": share}))
    store = Store(tmp_path / "store")
    build_manifest(spec, store)
    provider = MemoryProvider(behaviour)
    runner = ShardRunner(spec, store, provider, PRICE)
    runner.submit("s00001")
    runner.collect("s00001", poll_interval_s=0)
    if stops:
        with pytest.raises(SystemicError, match="retry-spend cap") as raised:
            runner.submit("s00001")
        assert raised.value.code == "retry_cap"
        assert JobControl(store, spec.name).current().code == "retry_cap"
        assert len(provider.batches) == 1  # nothing was sent
    else:
        assert runner.submit("s00001").requests == 3  # the poison item is not retried
        assert len(provider.batches) == 2


def test_a_collected_batch_stores_each_flush_as_a_result_part_and_its_payload_part(job):
    spec, store = job
    runner = ShardRunner(spec, store, MemoryProvider(behaviour), PRICE)
    runner.submit("s00001")
    runner.collect("s00001", poll_interval_s=0)
    paths = JobPaths(spec.name)
    parts = store.list_files(paths.results, recursive=True, suffix=".parquet")
    assert len(parts) == 2  # the provider's two flushes
    assert store.list_files(paths.payloads, recursive=True) == [paths.payload_part(rel) for rel in parts]
    for rel in parts:  # row for row: the payload part holds the result part's requests, in its order
        payload = store.read_part(paths.payload_part(rel), ["request_id", "attempt"])
        assert payload.equals(store.read_part(rel, ["request_id", "attempt"]))
        assert "raw_payload" not in store.read_part(rel).column_names
    assert read_results(store, spec.name, "s00001", ["status", "raw_payload"]).height == 9
