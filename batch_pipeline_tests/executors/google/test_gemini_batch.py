"""The gemini_batch executor with the real google-genai SDK over HTTP against the sandbox."""

import json
import threading

import pyarrow as pa
import pytest
from google.genai import types

from batch_pipeline.core.errors import ConfigError, SystemicError, TransientError
from batch_pipeline.core.ledger.executor import BatchState, RequestPlan, ShardWork
from batch_pipeline.core.quality.validate import validate
from batch_pipeline.core.spec.job import BackendSpec
from batch_pipeline.core.spec.loading import parse_spec
from batch_pipeline.executors.google.gemini_batch import (
    REFUSED_STATES,
    STATE_MAP,
    GeminiBatchExecutor,
    GeminiBatchSettings,
    input_file,
)
from batch_pipeline.executors.registry import batch_limits, create_executor, names

from ..conftest import wait_ended

LABELS = ["billing", "bug", "other"]
SPEC = f"""
name: gm
input: {{path: in.jsonl, text_field: body}}
prompt: {{version: v1, system: "Label the support ticket with one label.", template: "{{body}}"}}
model: gemini-2.5-flash
backend: {{name: gemini_batch, settings: {{sandbox: true}}}}
sampling: {{max_tokens: 16}}
output: {{choice: {LABELS}}}
"""


@pytest.fixture(autouse=True)
def _no_google_keys(monkeypatch):
    for name in ("GEMINI_API_KEY", "GOOGLE_API_KEY", "GOOGLE_GENAI_API_VERSION", "GOOGLE_GEMINI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


def work(n: int = 20, attempt: int = 1, prompts: list[str] | None = None) -> ShardWork:
    prompts = prompts or [
        f"ticket {i}: a billing question" if i % 2 else f"ticket {i}: a bug on start" for i in range(n)
    ]
    items = pa.table({"request_id": [f"{i:064x}" for i in range(len(prompts))], "user_prompt": prompts})
    return ShardWork("gm", "s00001", attempt, f"gm:s00001:{attempt}", RequestPlan.from_spec(parse_spec(SPEC)), items)


def executor(**settings) -> GeminiBatchExecutor:
    ex = create_executor(BackendSpec(name="gemini_batch", settings={"sandbox": True, **settings}))
    assert isinstance(ex, GeminiBatchExecutor)
    return ex


def fetch_all(ex: GeminiBatchExecutor, handle) -> pa.Table:
    tables = list(ex.fetch(handle))
    return pa.concat_tables(tables) if tables else pa.table({"request_id": pa.array([], pa.string())})


def creates(admin) -> list[dict]:
    return [r for r in admin.requests() if r["method"] == "POST" and r["path"].endswith(":batchGenerateContent")]


def test_registry_limits_settings_and_every_job_state():
    assert "gemini_batch" in names() and batch_limits("gemini_batch") == (10_000, 256 * 2**20)
    with pytest.raises(ConfigError, match="poll_intervl_s"):
        create_executor(BackendSpec(name="gemini_batch", settings={"sandbox": True, "poll_intervl_s": 1}))
    assert set(types.JobState) == set(STATE_MAP) | REFUSED_STATES  # every state the SDK can return is decided


def test_the_key_comes_from_gemini_api_key_then_google_api_key(monkeypatch):
    with pytest.raises(ConfigError, match="GEMINI_API_KEY"):
        GeminiBatchExecutor(GeminiBatchSettings())
    monkeypatch.setenv("GOOGLE_API_KEY", "from-google")
    assert GeminiBatchExecutor(GeminiBatchSettings())._key == "from-google"
    monkeypatch.setenv("GEMINI_API_KEY", "from-gemini")
    assert GeminiBatchExecutor(GeminiBatchSettings())._key == "from-gemini"
    monkeypatch.delenv("BATCH_PIPELINE_SANDBOX_URL", raising=False)
    with pytest.raises(ConfigError, match="BATCH_PIPELINE_SANDBOX_URL"):
        GeminiBatchExecutor(GeminiBatchSettings(sandbox=True))


def test_the_input_file_is_one_generate_content_request_per_key():
    data = input_file(work(3, prompts=['say "hi"\n', "ünïcode", "x"]))
    rows = [json.loads(line) for line in data.decode().splitlines()]
    assert [r["key"] for r in rows] == [f"{i:064x}" for i in range(3)]
    assert rows[0]["request"]["contents"] == [{"role": "user", "parts": [{"text": 'say "hi"\n'}]}]
    assert rows[1]["request"]["contents"][0]["parts"][0]["text"] == "ünïcode"
    request = rows[0]["request"]
    assert request["systemInstruction"] == {"parts": [{"text": "Label the support ticket with one label."}]}
    assert request["generationConfig"]["responseJsonSchema"]["properties"]["label"]["enum"] == LABELS
    assert request["generationConfig"]["maxOutputTokens"] == 16
    types.GenerateContentConfig.model_validate(request["generationConfig"])  # the SDK's own field names


def test_submit_poll_fetch_matches_on_key_and_validates_choices(admin):
    ex, w = executor(), work()
    handle = ex.submit(w)
    assert handle.batch_id.startswith("batches/") and handle.key == w.key and handle.input_file_id.startswith("files/")
    assert ex.poll(handle).state in (BatchState.VALIDATING, BatchState.RUNNING, BatchState.COMPLETED)
    status = wait_ended(ex, handle)
    assert status.state == BatchState.COMPLETED and status.provider_status == "JOB_STATE_SUCCEEDED"
    got = fetch_all(ex, handle)
    ids = got.column("request_id").to_pylist()
    assert sorted(ids) == sorted(w.request_ids) and ids != w.request_ids  # matched by key, not position
    by = {r["request_id"]: r for r in got.to_pylist()}
    for i, rid in enumerate(w.request_ids):
        assert json.loads(by[rid]["output_text"]) == {"label": "billing" if i % 2 else "bug"}
        assert by[rid]["finish_reason"] == "stop" and by[rid]["input_tokens"] > 0 and by[rid]["output_tokens"] > 0
        assert json.loads(by[rid]["raw_payload"])["key"] == rid
    assert set(validate(got, parse_spec(SPEC).output).status.to_pylist()) == {"succeeded"}
    billed = {e["custom_id"]: e for e in admin.ledger()}
    assert set(billed) == set(w.request_ids)
    assert sum(e["input_tokens"] for e in billed.values()) == sum(got.column("input_tokens").to_pylist())


def test_truncation_refusal_and_poison_are_read_as_on_the_other_backends(admin):
    ex = executor()
    w = work(
        prompts=[
            "a bug [[sandbox:truncate]]",
            "billing [[sandbox:refuse]]",
            "[[sandbox:poison]] x",
            "[[sandbox:block]] y",
            "a billing question",
        ]
    )
    handle = ex.submit(w)
    wait_ended(ex, handle)
    got = fetch_all(ex, handle)
    v = validate(got, parse_spec(SPEC).output)
    by = {
        rid: (s, c, k)
        for rid, s, c, k in zip(
            got.column("request_id").to_pylist(),
            v.status.to_pylist(),
            v.error_code.to_pylist(),
            v.error_class.to_pylist(),
        )
    }
    rid = w.request_ids
    assert by[rid[0]][:2] == ("invalid", "truncated")
    assert by[rid[1]][0] == "invalid" and by[rid[3]][0] == "invalid"  # refusals are never answers
    assert by[rid[2]] == ("errored", "invalid_argument", "poison")
    assert by[rid[4]][0] == "succeeded"
    finish = dict(zip(got.column("request_id").to_pylist(), got.column("finish_reason").to_pylist()))
    assert (finish[rid[0]], finish[rid[1]], finish[rid[3]]) == ("length", "refusal", "refusal")


@pytest.mark.parametrize(
    ("code", "klass"),
    [("server_error", "transient"), ("invalid_api_key", "systemic"), ("insufficient_quota", "systemic")],
)
def test_line_errors_carry_their_class(admin, code, klass):
    admin.set_scenario("line_errors", rate=1.0, times=1, code=code)
    ex = executor()
    handle = ex.submit(work(4))
    wait_ended(ex, handle)
    v = validate(fetch_all(ex, handle), parse_spec(SPEC).output)
    assert set(v.status.to_pylist()) == {"errored"} and set(v.error_class.to_pylist()) == {klass}


def test_systemic_errors_raise_once_with_the_key_redacted(admin, monkeypatch):
    monkeypatch.setenv("GEMINI_API_KEY", "sk-sandbox-bad")
    with pytest.raises(SystemicError) as bad:
        executor().submit(work(2))
    assert bad.value.code == "invalid_api_key" and "sk-sandbox-bad" not in str(bad.value)
    monkeypatch.delenv("GEMINI_API_KEY")
    uploads = [r for r in admin.requests() if r["path"].startswith("/upload/")]
    assert len(uploads) == 1  # not retried
    admin.set_scenario("unknown_model")
    with pytest.raises(SystemicError) as unknown:
        executor().submit(work(2))
    assert unknown.value.code == "model_not_found"
    admin.set_scenario("no_credit")
    with pytest.raises(SystemicError) as broke:
        executor().submit(work(2))
    assert broke.value.code == "insufficient_quota"
    assert creates(admin) and all(r["status"] != 200 for r in creates(admin)) and admin.ledger() == []


def test_a_429_is_retried_after_the_wait_google_asks_for(admin):
    admin.set_scenario("rate_limit", times=2, retry_after_ms=300, on=["gemini_create", "gemini_get"])
    ex = executor()
    handle = ex.submit(work(3))
    calls = creates(admin)
    assert [r["status"] for r in calls] == [429, 429, 200]
    gaps = [b["monotonic"] - a["monotonic"] for a, b in zip(calls, calls[1:])]
    assert min(gaps) >= 0.3  # the RetryInfo delay, not the SDK's own backoff
    assert wait_ended(ex, handle).state == BatchState.COMPLETED
    admin.set_scenario("rate_limit", times=10, retry_after_ms=10, on=["gemini_get"])
    with pytest.raises(TransientError):
        executor(max_retries=1).poll(handle)


def test_a_create_that_failed_in_transit_is_found_not_repeated(admin):
    admin.set_scenario("server_error", times=1, commit=True, on=["gemini_create"])
    ex = executor()
    w = work(3)
    handle = ex.submit(w)
    assert [r["status"] for r in creates(admin)] == [500]  # the batch exists although the client saw a 500
    assert ex.find(w.key) == handle.__class__(ex.name, handle.batch_id, w.key)
    assert wait_ended(ex, handle).state == BatchState.COMPLETED and len(admin.ledger()) == 3
    assert ex.find("gm:s00001:9") is None


def test_find_pages_through_the_list_by_display_name(admin):
    ex = executor()
    handles = [ex.submit(work(1, attempt=a)) for a in range(1, 4)]
    assert [ex.find(h.key).batch_id for h in handles] == [h.batch_id for h in handles]
    assert executor(find_scan_limit=1).find(handles[0].key) is None  # only the newest was scanned


def test_expiry_returns_nothing_and_a_cancel_keeps_what_finished(admin):
    admin.set_scenario("expire", complete_share=0.5)
    ex = executor()
    handle = ex.submit(work(6))
    assert wait_ended(ex, handle).state == BatchState.EXPIRED
    assert list(ex.fetch(handle)) == [] and admin.ledger() == []
    admin.set_scenario("slow", in_progress_s=3600)
    handle = ex.submit(work(4, attempt=2))
    admin.clock(advance_s=1800.05)
    ex.cancel(handle)
    assert wait_ended(ex, handle).state == BatchState.CANCELLED
    assert fetch_all(ex, handle).num_rows == 2
    ex.cancel(handle)  # already ended: nothing to do, no error


def test_a_failed_batch_says_why(admin):
    admin.set_scenario("fail_validation", lines=[1])
    ex = executor()
    handle = ex.submit(work(2))
    status = wait_ended(ex, handle)
    assert status.state == BatchState.FAILED and "fail_validation" in status.errors[0]
    assert list(ex.fetch(handle)) == []


def test_a_reader_that_stops_early_does_not_hang_the_download(admin):
    ex = executor(parse_workers=1)
    handle = ex.submit(work(50))
    wait_ended(ex, handle)
    earlier = set(threading.enumerate())
    chunks = ex._download(ex._get(handle).dest.file_name)
    assert next(chunks)
    chunks.close()
    # the download thread has ended by then (closing joins it for up to 5 s: a hang would leave it alive)
    assert [t for t in threading.enumerate() if t.name == "gemini-download" and t not in earlier] == []


def test_a_429_on_an_upload_session_restarts_the_upload_not_the_chunk(admin):
    admin.set_scenario("rate_limit", times=3, retry_after_ms=10, on=["gemini_upload_chunk"])
    ex = executor()
    handle = ex.submit(work(3))
    uploads = [r["status"] for r in admin.requests() if r["path"] == "/upload/v1/files"]
    # start, refused chunk (its x-goog-upload-status stops the SDK re-sending it), three times; then a clean upload
    assert uploads == [200, 429] * 3 + [200, 200]
    assert wait_ended(ex, handle).state == BatchState.COMPLETED
