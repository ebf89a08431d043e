"""The Anthropic batch executor with the real anthropic SDK over HTTP against the sandbox."""

import json
import typing
from datetime import UTC, datetime

import pyarrow as pa
import pytest
from anthropic.types.messages import MessageBatch

from batch_pipeline.core.errors import ConfigError, ErrorClass, SystemicError, TransientError, classify_line_error
from batch_pipeline.core.ledger.attempts import AttemptLog
from batch_pipeline.core.ledger.executor import BatchState, RequestPlan, ShardWork
from batch_pipeline.core.manifest.shards import build_manifest
from batch_pipeline.core.quality.validate import validate
from batch_pipeline.core.run.runner import ShardRunner
from batch_pipeline.core.spec.job import BackendSpec
from batch_pipeline.core.spec.loading import parse_spec
from batch_pipeline.core.store import Store
from batch_pipeline.executors.anthropic.batch import STATUS_MAP, AnthropicBatchExecutor, AnthropicBatchSettings
from batch_pipeline.executors.anthropic.format import (
    ANTHROPIC_RAW_SCHEMA,
    _parse_fast,
    _parse_lines,
    batch_requests,
    parse_results_block,
)
from batch_pipeline.executors.registry import batch_limits, create_executor, names

from ..conftest import wait_ended

LABELS = ["billing", "bug", "other"]
LONG_SYSTEM = "Label the support ticket with exactly one of the allowed labels. " * 100  # > 1024 tokens
SPEC = f"""
name: an
input: {{path: in.jsonl, text_field: body}}
prompt: {{version: v1, system: "{LONG_SYSTEM.strip()}", template: "{{body}}"}}
model: claude-sonnet-4-5
backend: {{name: anthropic_batch, settings: {{sandbox: true}}}}
sampling: {{max_tokens: 16}}
output: {{choice: {LABELS}}}
"""


def spec(text: str = SPEC):
    return parse_spec(text)


def work(n: int = 20, attempt: int = 1, prompts: list[str] | None = None, text: str = SPEC) -> ShardWork:
    prompts = prompts or [
        f"ticket {i}: a billing question" if i % 2 else f"ticket {i}: app bug on start" for i in range(n)
    ]
    items = pa.table({"request_id": [f"{i:064x}" for i in range(len(prompts))], "user_prompt": prompts})
    return ShardWork("an", "s00001", attempt, f"an:s00001:{attempt}", RequestPlan.from_spec(spec(text)), items)


def executor(text: str = SPEC) -> AnthropicBatchExecutor:
    ex = create_executor(spec(text).backend)
    assert isinstance(ex, AnthropicBatchExecutor)
    return ex


def fetch_all(ex: AnthropicBatchExecutor, handle) -> pa.Table:
    tables = list(ex.fetch(handle))
    assert all(t.schema == ANTHROPIC_RAW_SCHEMA for t in tables)
    return pa.concat_tables(tables)


def rows(table: pa.Table) -> dict[str, dict]:
    return {r["request_id"]: r for r in table.to_pylist()}


def test_registry_limits_settings_and_every_processing_status():
    assert "anthropic_batch" in names()
    assert batch_limits("anthropic_batch") == (100_000, 256 * 2**20)
    with pytest.raises(ConfigError, match="poll_intervl_s"):
        create_executor(BackendSpec(name="anthropic_batch", settings={"sandbox": True, "poll_intervl_s": 1}))
    statuses = set(typing.get_args(MessageBatch.model_fields["processing_status"].annotation))
    assert statuses == set(STATUS_MAP)


def test_missing_sandbox_url_or_key_is_a_clear_config_error(monkeypatch):
    monkeypatch.delenv("BATCH_PIPELINE_SANDBOX_URL", raising=False)
    with pytest.raises(ConfigError, match="BATCH_PIPELINE_SANDBOX_URL"):
        AnthropicBatchExecutor(AnthropicBatchSettings(sandbox=True))
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY"):
        AnthropicBatchExecutor(AnthropicBatchSettings())


def test_requests_cache_the_system_prompt_and_force_the_answer_tool():
    requests, size = batch_requests(work(3))
    assert [r["custom_id"] for r in requests] == [f"{i:064x}" for i in range(3)]
    params = requests[0]["params"]
    assert params["system"] == [{"type": "text", "text": LONG_SYSTEM.strip(), "cache_control": {"type": "ephemeral"}}]
    assert params["messages"] == [{"role": "user", "content": "ticket 0: app bug on start"}]
    assert params["tools"][0]["name"] == "answer" and params["tool_choice"] == {"type": "tool", "name": "answer"}
    assert params["tools"][0]["input_schema"]["properties"]["label"]["enum"] == LABELS
    assert params["max_tokens"] == 16 and params["model"] == "claude-sonnet-4-5" and "seed" not in params
    assert size >= len(json.dumps({"requests": requests}))  # an upper bound of the body
    text_spec = SPEC.replace(f"output: {{choice: {LABELS}}}", "output: {text: {}}")
    assert "tools" not in batch_requests(work(1, text=text_spec))[0][0]["params"]
    with pytest.raises(ConfigError, match="custom_id"):
        bad = work(1)
        bad.items = pa.table({"request_id": ["x" * 65], "user_prompt": ["hi"]})
        batch_requests(bad)


def test_submit_poll_fetch_validates_choices_and_records_cache_tokens(admin):
    ex, w = executor(), work()
    handle = ex.submit(w)
    assert handle.backend == "anthropic_batch" and handle.batch_id.startswith("msgbatch_")
    running = ex.poll(handle)
    assert running.state in (BatchState.RUNNING, BatchState.COMPLETED) and running.total == 20
    status = wait_ended(ex, handle)
    assert status.state == BatchState.COMPLETED and (status.total, status.completed, status.failed) == (20, 20, 0)
    got = fetch_all(ex, handle)
    ids = got.column("request_id").to_pylist()
    assert sorted(ids) == sorted(w.request_ids) and ids != w.request_ids  # matched by ID, not position
    by = rows(got)
    for i, rid in enumerate(w.request_ids):
        assert json.loads(by[rid]["output_text"]) == {"label": "billing" if i % 2 else "bug"}
        assert by[rid]["http_status"] == 200 and by[rid]["finish_reason"] == "stop"
        assert by[rid]["provider_request_id"].startswith("msg_") and json.loads(by[rid]["raw_payload"])
    verdicts = validate(got, spec().output)
    assert set(verdicts.status.to_pylist()) == {"succeeded"}
    assert set(verdicts.parsed_output.to_pylist()) == {"billing", "bug"}
    cached = got.column("cached_tokens").to_pylist()
    assert sorted(c > 0 for c in cached) == [False] + [True] * 19  # the first request writes the cache
    assert all(r["input_tokens"] > r["cached_tokens"] > 1024 for r in got.to_pylist() if r["cached_tokens"])
    ledger = admin.ledger()
    assert len(ledger) == 20 and sum(e["cached_tokens"] for e in ledger) == sum(cached)


def test_truncation_refusal_poison_and_line_errors_are_recorded(admin):
    admin.set_scenario("line_errors", rate=1.0)
    prompts = [
        "a billing question [[sandbox:truncate]]",
        "help [[sandbox:refuse]]",
        "bad [[sandbox:poison]]",
        "a billing issue",
    ]
    ex, w = executor(), work(prompts=prompts)
    handle = ex.submit(w)
    status = wait_ended(ex, handle)
    assert status.state == BatchState.COMPLETED and status.failed == 4  # line_errors: every line fails once
    first = rows(fetch_all(ex, handle))
    assert {r["error_code"] for r in first.values()} == {"invalid_request_error", "api_error"}
    assert classify_line_error("api_error", first[w.request_ids[3]]["http_status"]) == ErrorClass.TRANSIENT
    handle = ex.submit(work(prompts=prompts, attempt=2))
    wait_ended(ex, handle)
    got = fetch_all(ex, handle)
    by = rows(got)
    trunc, refuse, poison, ok = (by[rid] for rid in w.request_ids)
    assert trunc["finish_reason"] == "length" and trunc["http_status"] == 200
    assert refuse["finish_reason"] == "refusal" and refuse["output_text"] == ""
    assert refuse["error_message"] == "refused (stop_reason=refusal)"
    assert poison["http_status"] == 400 and poison["error_code"] == "invalid_request_error"
    assert classify_line_error(poison["error_code"], poison["http_status"]) == ErrorClass.POISON
    assert json.loads(ok["output_text"]) == {"label": "billing"}
    verdicts = dict(zip(got.column("request_id").to_pylist(), validate(got, spec().output).error_code.to_pylist()))
    assert [verdicts[rid] for rid in w.request_ids] == [
        "truncated",
        "contract_violation",
        "invalid_request_error",
        None,
    ]


def test_text_output_is_the_message_text(admin):
    text_spec = SPEC.replace(f"output: {{choice: {LABELS}}}", "output: {text: {}}")
    ex = executor(text_spec)
    handle = ex.submit(work(3, text=text_spec))
    wait_ended(ex, handle)
    texts = fetch_all(ex, handle).column("output_text").to_pylist()
    assert all(t.startswith("Sandbox reply to: ticket") for t in texts)


def test_expired_and_cancelled_batches_keep_partial_results(admin):
    admin.set_scenario("expire", complete_share=0.5)
    ex = executor()
    handle = ex.submit(work(10))
    status = wait_ended(ex, handle)
    assert status.state == BatchState.EXPIRED and (status.completed, status.failed) == (5, 5)
    got = fetch_all(ex, handle).to_pylist()
    expired = [r for r in got if r["http_status"] is None]
    assert len(expired) == 5 and {r["error_code"] for r in expired} == {"batch_expired"}
    assert classify_line_error("batch_expired", None) == ErrorClass.TRANSIENT

    admin.set_scenario("slow", in_progress_s=100)
    handle = ex.submit(work(10, attempt=2))
    ex.cancel(handle)
    assert ex.poll(handle).state in (BatchState.CANCELLING, BatchState.CANCELLED)
    status = wait_ended(ex, handle)
    assert status.state == BatchState.CANCELLED
    got = fetch_all(ex, handle).to_pylist()
    assert {r["error_code"] for r in got} == {"batch_cancelled"} and len(got) == 10
    ex.cancel(handle)  # cancelling an ended batch is a no-op, not an error


def test_bad_key_unknown_model_and_no_credit_are_systemic(admin, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-sandbox-bad")
    with pytest.raises(SystemicError, match="401") as err:
        executor().submit(work(2))
    assert "sk-sandbox-bad" not in str(err.value) and err.value.code == "authentication_error"
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    with pytest.raises(SystemicError, match="unknown model") as err:
        executor().submit(work(2, text=SPEC.replace("claude-sonnet-4-5", "unknown-claude")))
    assert err.value.code == "model_not_found"
    admin.set_scenario("no_credit")
    with pytest.raises(SystemicError, match="credit") as err:
        executor().submit(work(2))
    assert err.value.code == "credit_balance_too_low"
    assert admin.ledger() == []


def test_transient_create_failures_never_leave_a_duplicate_batch(admin):
    admin.set_scenario("server_error", on=["anthropic_create"], commit=True)  # 500, but the batch was created
    ex = executor()
    handle = ex.submit(work(4))
    batches = list(ex.client.messages.batches.list())
    assert [b.id for b in batches] == [handle.batch_id]
    admin.set_scenario("rate_limit", times=2, retry_after_ms=20, on=["anthropic_create"])
    ex.submit(work(4, attempt=2))
    creates = [r["status"] for r in admin.requests() if r["path"] == "/v1/messages/batches" and r["method"] == "POST"]
    assert creates == [500, 429, 429, 200]
    admin.set_scenario("rate_limit", times=10, retry_after_ms=20, on=["anthropic_retrieve"])
    with pytest.raises(TransientError, match="429"):
        ex.poll(handle)


def test_find_reattaches_after_a_crash_by_size_time_and_custom_ids(admin):
    intent_at = datetime.now(UTC)
    admin.clock(freeze=True)
    w = work(6, attempt=3)
    executor().submit(work(4))  # other batches, of other sizes
    executor().submit(work(5))
    accepted = executor().submit(w)  # ... and the process dies here
    fresh = executor()  # a new process: nothing remembered
    assert fresh.find(w.key) is None  # the plain key is not enough on Anthropic
    found = fresh.find(w.key, request_ids=w.request_ids, not_before=intent_at.isoformat())
    assert found is not None and found.batch_id == accepted.batch_id and found.key == w.key  # unverified, running
    assert fresh.poll(found).state == BatchState.RUNNING
    admin.clock(advance_s=5)
    again = fresh.find(w.key, request_ids=w.request_ids, not_before=intent_at)
    assert again is not None and again.batch_id == accepted.batch_id  # verified by its results' custom_ids
    assert any(r["path"].endswith(f"{accepted.batch_id}/results") for r in admin.requests())
    other = [f"{i:064x}" for i in range(100, 106)]  # same size, other items: an ended batch is told apart
    assert fresh.find("an:s00001:9", request_ids=other, not_before=intent_at) is None
    assert fresh.find(w.key, request_ids=w.request_ids, not_before=datetime.now(UTC).replace(year=2100)) is None


def test_find_refuses_to_guess_between_unfinished_batches(admin):
    admin.set_scenario("slow", in_progress_s=100)
    intent_at = datetime.now(UTC)
    ex = executor()
    ex.submit(work(3, attempt=1))
    ex.submit(work(3, attempt=2))
    with pytest.raises(TransientError, match="2 unfinished batches"):
        executor().find("an:s00001:1", request_ids=work(3).request_ids, not_before=intent_at)


def test_runner_reattaches_in_process_without_a_second_batch(admin, tmp_path):
    """The provider accepted the batch but recording it failed: the same process repairs it through find()."""
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"body": f"row {i} invoice"}) + "\n" for i in range(7)))
    job = spec(SPEC.replace("path: in.jsonl", f"path: {tmp_path}/in.jsonl"))
    store = Store(tmp_path / "home")
    build_manifest(job, store)
    ex = create_executor(job.backend)
    runner = ShardRunner(job, store, ex, None)
    pending = runner.pending_items("s00001")
    log = AttemptLog(store, "an", "s00001")
    w = ShardWork("an", "s00001", 1, "an:s00001:1", runner.plan, pending)
    log.record(1, "intent", {"key": w.key, "backend": ex.name, "request_ids": w.request_ids, "requests": 7})
    accepted = ex.submit(w)
    outcome = runner.submit("s00001")
    assert outcome.reattached and outcome.handle.batch_id == accepted.batch_id
    creates = [r for r in admin.requests() if r["method"] == "POST" and r["path"] == "/v1/messages/batches"]
    assert len(creates) == 1
    runner.collect("s00001", poll_interval_s=0.05)
    assert runner.pending_items("s00001").num_rows == 0
    assert len(admin.ledger()) == 7


def ok(cid: str, content: list, stop: str = "end_turn") -> dict:
    """A succeeded result line with the given content blocks."""
    return {
        "custom_id": cid,
        "result": {
            "type": "succeeded",
            "message": {
                "id": f"msg_{cid}",
                "type": "message",
                "role": "assistant",
                "model": "m",
                "content": content,
                "stop_reason": stop,
                "stop_sequence": None,
                "usage": {
                    "input_tokens": 5,
                    "output_tokens": 3,
                    "cache_creation_input_tokens": 7,
                    "cache_read_input_tokens": 11,
                    "service_tier": "batch",
                },
            },
        },
    }


def test_results_parser_handles_every_result_type_and_odd_lines():
    lines = [
        ok("t", [{"type": "text", "text": "Hello "}, {"type": "text", "text": "world"}]),
        ok(
            "u",
            [{"type": "tool_use", "id": "x", "name": "answer", "input": {"label": "bug", "n": {"deep": [1]}}}],
            "tool_use",
        ),
        ok("m", [{"type": "text", "text": "cut"}], "max_tokens"),
        ok("q", [{"type": "text", "text": "?"}], "some_future_reason"),
        {
            "custom_id": "e",
            "result": {
                "type": "errored",
                "error": {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}},
            },
        },
        {"custom_id": "c", "result": {"type": "canceled"}},
        {"custom_id": "x", "result": {"type": "expired"}},
    ]
    block = "\n".join(json.dumps(line) for line in lines).encode() + b"\n"
    by = rows(parse_results_block(block))
    assert by["t"]["output_text"] == "Hello world" and by["t"]["finish_reason"] == "stop"
    assert (by["t"]["input_tokens"], by["t"]["cached_tokens"], by["t"]["output_tokens"]) == (23, 11, 3)
    assert json.loads(by["u"]["output_text"]) == {"label": "bug", "n": {"deep": [1]}}
    assert by["m"]["finish_reason"] == "length" and by["q"]["finish_reason"] == "some_future_reason"
    assert (by["e"]["http_status"], by["e"]["error_code"], by["e"]["error_message"]) == (
        500,
        "overloaded_error",
        "busy",
    )
    assert by["c"]["http_status"] is None and by["c"]["error_code"] == "batch_cancelled"
    assert by["x"]["error_code"] == "batch_expired" and by["x"]["input_tokens"] is None
    odd = (
        block
        + b"not json\n"
        + json.dumps(
            {
                "custom_id": "w",
                "result": {
                    "type": "succeeded",
                    "message": {"content": "not a list", "usage": {"input_tokens": "many"}},
                },
            }
        ).encode()
    )
    by = {r["request_id"]: r for r in parse_results_block(odd).to_pylist()}
    assert by[None]["error_code"] == "unparseable_line" and by["t"]["output_text"] == "Hello world"
    assert by["w"]["http_status"] == 200 and by["w"]["output_text"] == ""
    assert all(r["raw_payload"] for r in by.values())


def test_a_result_line_that_is_not_utf8_sinks_only_itself():
    good = {
        "custom_id": "g",
        "result": {
            "type": "succeeded",
            "message": {
                "content": [{"type": "text", "text": "fine"}],
                "stop_reason": "end_turn",
                "usage": {"input_tokens": 5, "output_tokens": 1},
            },
        },
    }
    bad = json.dumps({**good, "custom_id": "b"}).encode().replace(b'"b"', b'"b\xff"')
    out = parse_results_block(json.dumps(good).encode() + b"\n" + bad + b"\n").to_pylist()
    assert [r["request_id"] for r in out] == ["g", None]
    assert out[0]["output_text"] == "fine"
    assert out[1]["error_code"] == "unparseable_line" and "UTF-8" in out[1]["error_message"]
    assert "\ufffd" in out[1]["raw_payload"]


def test_the_column_wise_path_gives_the_per_line_paths_rows_with_odd_rows_in_place():
    regular = [
        ok("text", [{"type": "text", "text": "Hello ünï"}]),
        ok(
            "tool",
            [{"type": "tool_use", "id": "t", "name": "answer", "input": {"label": "bug", "n": [1, {"x": "é"}]}}],
            "tool_use",
        ),
        ok("cut", [{"type": "text", "text": "cu"}], "max_tokens"),
        ok("refused", [{"type": "text", "text": ""}], "refusal"),
        {
            "custom_id": "err",
            "result": {
                "type": "errored",
                "error": {"type": "error", "error": {"type": "invalid_request_error", "message": "too long"}},
            },
        },
        {"custom_id": "gone", "result": {"type": "expired"}},
        {"custom_id": "stopped", "result": {"type": "canceled"}},
    ]
    odd = [
        ok("two", [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]),
        ok(
            "think",
            [
                {"type": "thinking", "thinking": "hmm", "signature": "s"},
                {"type": "tool_use", "id": "t", "name": "answer", "input": {"label": "other"}},
            ],
            "tool_use",
        ),
        ok("empty", []),
    ]
    lines = [regular[0], odd[0], *regular[1:4], odd[1], *regular[4:], odd[2]]
    block = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines).encode()
    fast = _parse_fast(block)
    assert fast is not None, "a clean block takes the column-wise path"
    assert fast.equals(_parse_lines(block))
    assert fast.column("request_id").to_pylist() == [line["custom_id"] for line in lines]
    by = rows(fast)
    assert json.loads(by["tool"]["output_text"]) == {"label": "bug", "n": [1, {"x": "é"}]}
    assert by["two"]["output_text"] == "ab" and json.loads(by["think"]["output_text"]) == {"label": "other"}
    assert by["empty"]["output_text"] == "" and by["text"]["output_text"] == "Hello ünï"
    assert (by["err"]["http_status"], by["err"]["error_code"]) == (400, "invalid_request_error")
    assert by["gone"]["error_code"] == "batch_expired" and by["stopped"]["error_code"] == "batch_cancelled"
    assert by["refused"]["error_message"] == "refused (stop_reason=refusal)"
    assert by["cut"]["finish_reason"] == "length" and by["text"]["input_tokens"] == 23
