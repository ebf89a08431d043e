"""The OpenAI batch executor with the real openai SDK over HTTP against the sandbox."""

import json
from pathlib import Path

import openai
import pyarrow as pa
import pytest

from batch_pipeline.core.errors import ConfigError, SystemicError
from batch_pipeline.core.ledger.attempts import AttemptLog
from batch_pipeline.core.ledger.executor import BatchState, RequestPlan, ShardWork
from batch_pipeline.core.manifest.shards import build_manifest
from batch_pipeline.core.run.runner import ShardRunner
from batch_pipeline.core.spec.loading import parse_spec
from batch_pipeline.core.store import Store
from batch_pipeline.executors.openai.batch import STATUS_MAP, OpenAIBatchExecutor, OpenAIBatchSettings
from batch_pipeline.executors.openai.format import parse_output_block, request_lines
from batch_pipeline.executors.registry import create_executor, names

from ..conftest import wait_ended

OPENAPI = Path(__file__).resolve().parents[2] / "fixtures" / "openai-files-batches.openapi.json"
LABELS = ["billing", "bug", "other"]
SPEC = f"""
name: ex
input: {{path: in.jsonl, text_field: body}}
prompt: {{version: v1, system: "Label it.", template: "{{body}}"}}
model: gpt-4o-mini
backend: {{name: openai_batch, settings: {{sandbox: true}}}}
sampling: {{max_tokens: 16}}
output: {{choice: {LABELS}}}
"""


def work(n: int = 20, attempt: int = 1) -> ShardWork:
    spec = parse_spec(SPEC)
    items = pa.table(
        {
            "request_id": [f"{i:064x}" for i in range(n)],
            "user_prompt": [
                f"ticket {i}: my invoice was wrong" if i % 2 else f"ticket {i}: app crashes" for i in range(n)
            ],
        }
    )
    return ShardWork("ex", "s00001", attempt, f"ex:s00001:{attempt}", RequestPlan.from_spec(spec), items)


def executor() -> OpenAIBatchExecutor:
    return create_executor(parse_spec(SPEC).backend)


def test_registry_knows_openai_batch_and_rejects_unknown_settings():
    assert "openai_batch" in names()
    with pytest.raises(ConfigError, match="poll_intervl_s"):
        from batch_pipeline.core.spec.job import BackendSpec

        create_executor(BackendSpec(name="openai_batch", settings={"sandbox": True, "poll_intervl_s": 1}))


def test_every_openapi_batch_status_is_mapped_explicitly():
    spec = json.loads(OPENAPI.read_text())
    statuses = set(spec["components"]["schemas"]["Batch"]["properties"]["status"]["enum"])
    assert statuses == set(STATUS_MAP)


def test_submit_poll_fetch_matches_results_by_id(admin):
    ex, w = executor(), work()
    handle = ex.submit(w)
    status = wait_ended(ex, handle)
    assert status.state == BatchState.COMPLETED and status.total == 20
    tables = list(ex.fetch(handle))
    got = pa.concat_tables(tables)
    assert sorted(got.column("request_id").to_pylist()) == sorted(w.request_ids)
    assert got.column("request_id").to_pylist() != w.request_ids  # the provider shuffles; we match by ID
    for rid, text in zip(got.column("request_id").to_pylist(), got.column("output_text").to_pylist()):
        assert json.loads(text)["label"] in LABELS, (rid, text)
    assert min(got.column("input_tokens").to_pylist()) > 0
    # the metadata carries the attempt key
    batch = ex.client.batches.retrieve(handle.batch_id)
    assert batch.metadata["batch_pipeline_key"] == w.key


def test_find_reattaches_by_key_and_returns_none_for_unknown(admin):
    ex = executor()
    handle = ex.submit(work(attempt=3))
    ex.submit(work(attempt=4))
    found = ex.find("ex:s00001:3")
    assert found is not None and found.batch_id == handle.batch_id
    assert ex.find("ex:s00001:99") is None


def test_bad_key_is_systemic_and_names_the_cause(admin, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-sandbox-bad")
    with pytest.raises(SystemicError, match="401") as err:
        executor().submit(work())
    assert "sk-sandbox-bad" not in str(err.value)  # secrets never appear in messages
    assert admin.ledger() == []


def test_missing_sandbox_url_is_a_clear_config_error(monkeypatch):
    monkeypatch.delenv("BATCH_PIPELINE_SANDBOX_URL", raising=False)
    with pytest.raises(ConfigError, match="BATCH_PIPELINE_SANDBOX_URL"):
        OpenAIBatchExecutor(OpenAIBatchSettings(sandbox=True))


def test_request_lines_are_valid_openai_batch_input():
    w = work(5)
    lines = [json.loads(line) for line in request_lines(w).decode().splitlines()]
    assert [line["custom_id"] for line in lines] == w.request_ids
    body = lines[0]["body"]
    assert lines[0]["method"] == "POST" and lines[0]["url"] == "/v1/chat/completions"
    assert body["messages"][0] == {"role": "system", "content": "Label it."}  # stable prefix first
    assert body["messages"][1]["content"] == w.items.column("user_prompt")[0].as_py()
    assert body["response_format"]["json_schema"]["schema"]["properties"]["label"]["enum"] == LABELS
    assert body["max_tokens"] == 16 and body["model"] == "gpt-4o-mini"


HARD_PROMPTS = [
    'say "hi"\\',
    "line\nbreak\ttab\x01\x1f\x7f",
    "sep\u2028para\u2029",
    "caf\u00e9 \U0001f600",
    "",
    "</script>",
]


def test_request_lines_are_byte_for_byte_the_lines_made_one_by_one():
    """The file is built column-wise (``RequestPlan.request_lines``); its bytes must be what ``json.dumps`` makes of
    each line: escapes, separators and non-ASCII kept as they are (the prefix a provider caches)."""
    w = work(len(HARD_PROMPTS))
    items = w.items.set_column(1, "user_prompt", pa.array(HARD_PROMPTS, pa.string()))
    w = ShardWork(w.job, w.shard_id, w.attempt, w.key, w.plan, items)
    got = request_lines(w).decode("utf-8").split("\n")
    assert got[-1] == "" and len(got) == len(HARD_PROMPTS) + 1
    for line, rid, prompt in zip(got, w.request_ids, HARD_PROMPTS):
        body = json.loads(line)["body"]
        messages = [{"role": "system", "content": "Label it."}, {"role": "user", "content": prompt}]
        rest = {k: v for k, v in body.items() if k != "messages"}
        expected = {
            "custom_id": rid,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {**rest, "messages": messages},
        }
        assert line == json.dumps(expected, ensure_ascii=False, separators=(",", ":")), prompt
    assert request_lines(ShardWork(w.job, w.shard_id, w.attempt, w.key, w.plan, items.slice(0, 0))) == b"\n"


def test_output_parser_handles_success_http_errors_expiry_and_odd_lines():
    ok = {
        "id": "r1",
        "custom_id": "a",
        "error": None,
        "response": {
            "status_code": 200,
            "request_id": "q1",
            "body": {
                "id": "c",
                "choices": [
                    {"index": 0, "finish_reason": "length", "message": {"role": "assistant", "content": "bil"}}
                ],
                "usage": {"prompt_tokens": 11, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 4}},
            },
        },
    }
    http_err = {
        "id": "r2",
        "custom_id": "b",
        "error": None,
        "response": {
            "status_code": 500,
            "request_id": "q2",
            "body": {"error": {"message": "boom", "type": "server_error", "code": None}},
        },
    }
    expired = {"id": "r3", "custom_id": "c", "response": None, "error": {"code": "batch_expired", "message": "late"}}
    weird = {
        "id": "r4",
        "custom_id": "d",
        "response": {
            "status_code": 200,
            "body": {"choices": [{"finish_reason": "stop", "message": {"content": [{"type": "text", "text": "x"}]}}]},
        },
    }
    block = "\n".join(json.dumps(x) for x in (ok, http_err, expired, weird)).encode() + b"\n\nnot json\n"
    t = parse_output_block(block).to_pylist()
    by = {r["request_id"]: r for r in t}
    assert by["a"]["finish_reason"] == "length" and by["a"]["cached_tokens"] == 4 and by["a"]["input_tokens"] == 11
    assert by["b"]["http_status"] == 500 and by["b"]["error_code"] == "server_error"
    assert by["c"]["http_status"] is None and by["c"]["error_code"] == "batch_expired"
    assert by["d"]["http_status"] == 200 and "text" in by["d"]["output_text"]
    assert by[None]["error_code"] == "unparseable_line"
    assert all(r["raw_payload"] for r in t)


def test_crash_between_accept_and_record_reattaches_without_a_second_batch(admin, tmp_path):
    """The provider accepted the batch but the process died before writing `submitted`: find() repairs it."""
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"body": f"row {i} crashes"}) + "\n" for i in range(7)))
    spec = parse_spec(SPEC.replace("path: in.jsonl", f"path: {tmp_path}/in.jsonl"))
    store = Store(tmp_path / "home")
    build_manifest(spec, store)
    ex = create_executor(spec.backend)
    runner = ShardRunner(spec, store, ex, None)
    pending = runner.pending_items("s00001")
    log = AttemptLog(store, "ex", "s00001")
    w = ShardWork("ex", "s00001", 1, "ex:s00001:1", runner.plan, pending)
    log.record(1, "intent", {"key": w.key, "backend": ex.name, "request_ids": w.request_ids, "requests": 7})
    accepted = ex.submit(w)  # ... and the process dies here
    outcome = runner.submit("s00001")
    assert outcome.reattached and outcome.handle.batch_id == accepted.batch_id
    creates = [r for r in admin.requests() if r["method"] == "POST" and r["path"] == "/v1/batches"]
    assert len(creates) == 1
    runner.collect("s00001", poll_interval_s=0.05)
    assert runner.pending_items("s00001").num_rows == 0
    assert len(admin.ledger()) == 7


def test_a_create_that_failed_in_transit_but_succeeded_is_not_created_twice(admin):
    """The provider made the batch and then answered 500: a blind retry would pay twice."""
    admin.set_scenario("server_error", times=1, on=["create_batch"], commit=True)
    ex, w = executor(), work(6)
    handle = ex.submit(w)
    creates = [r for r in admin.requests() if r["method"] == "POST" and r["path"] == "/v1/batches"]
    assert [r["status"] for r in creates] == [500]  # no second create: found by key instead
    listed = ex.client.batches.list(limit=100).data
    assert [b.id for b in listed] == [handle.batch_id]
    wait_ended(ex, handle)
    assert len(admin.ledger()) == 6


def test_a_create_that_really_failed_is_retried_after_the_provider_wait(admin):
    admin.set_scenario("rate_limit", times=2, retry_after_ms=200, on=["create_batch"])
    ex, w = executor(), work(3)
    handle = ex.submit(w)
    creates = [r for r in admin.requests() if r["method"] == "POST" and r["path"] == "/v1/batches"]
    assert [r["status"] for r in creates] == [429, 429, 200]
    gaps = [b["monotonic"] - a["monotonic"] for a, b in zip(creates, creates[1:])]
    assert min(gaps) >= 0.2  # retry-after-ms honoured
    assert wait_ended(ex, handle).state == BatchState.COMPLETED


@pytest.mark.parametrize(
    ("headers", "wait"),
    [({"retry-after-ms": "250", "retry-after": "9"}, 0.25), ({"retry-after": "2"}, 2.0), ({}, None)],
)
def test_a_rate_limit_carries_the_providers_wait_from_either_header(headers, wait):
    import httpx2

    from batch_pipeline.core.errors import TransientError
    from batch_pipeline.executors.openai.batch import translate

    response = httpx2.Response(429, headers=headers, request=httpx2.Request("POST", "http://127.0.0.1/v1/batches"))
    error = translate(openai.RateLimitError("slow down", response=response, body=None), "batch create")
    assert isinstance(error, TransientError) and error.retry_after_s == wait


def test_a_download_that_breaks_half_way_is_a_transient_error(monkeypatch):
    """A server that promises a whole output file and closes the connection after part of it."""
    import http.server
    import threading

    from batch_pipeline.core.errors import TransientError
    from batch_pipeline.core.ledger.executor import BatchHandle

    line = json.dumps({"id": "r", "custom_id": "a", "error": None, "response": {"status_code": 200, "body": {}}})

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            if self.path.endswith("/content"):
                body = (line + "\n").encode()
                self.send_response(200)
                self.send_header("Content-Length", str(100 * len(body)))  # promises 100 lines, sends 1
                self.end_headers()
                self.wfile.write(body)
                self.wfile.flush()
                self.close_connection = True
                return
            batch = {
                "id": "batch_1",
                "object": "batch",
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
                "created_at": 1,
                "input_file_id": "file-in",
                "status": "completed",
                "output_file_id": "file-out",
                "error_file_id": None,
            }
            data = json.dumps(batch).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        monkeypatch.setenv("BROKEN_KEY", "sk-test-broken")
        ex = OpenAIBatchExecutor(
            OpenAIBatchSettings(
                base_url=f"http://127.0.0.1:{server.server_port}/v1", api_key_env="BROKEN_KEY", max_retries=0
            )
        )
        with pytest.raises(TransientError, match="download"):
            list(ex.fetch(BatchHandle("openai_batch", "batch_1", "ex:s00001:1")))
    finally:
        server.shutdown()
        server.server_close()
