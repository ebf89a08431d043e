"""The online executor against the sandbox process over HTTP: throughput, retries, limits, error classes."""

import json
import signal
import statistics
import threading
import time
from collections import defaultdict
from typing import Any

import pyarrow as pa
import pytest

from batch_pipeline.core.errors import ConfigError, SystemicError
from batch_pipeline.core.ledger.executor import RAW_RESULT_SCHEMA, RequestPlan, ShardWork, StreamExecutor
from batch_pipeline.core.spec.job import BackendSpec
from batch_pipeline.core.spec.loading import parse_spec
from batch_pipeline.executors.online.executor import OnlineExecutor, classify
from batch_pipeline.executors.online.rate_limit import RateLimiter, parse_duration
from batch_pipeline.executors.online.transport import BodyBuilder, Reply
from batch_pipeline.executors.openai.format import body_settings, chat_messages
from batch_pipeline.executors.provider_errors import retry_after_s
from batch_pipeline.executors.registry import batch_limits, create_executor, names
from batch_pipeline.sandbox import SandboxAdmin
from batch_pipeline.sandbox.openai.chat import _messages_key

CHAT = "/v1/chat/completions"
LABELS = ["billing", "bug", "other"]
SPEC = f"""
name: online_job
input: {{path: in.jsonl, text_field: body}}
prompt: {{version: v1, system: "Label it.", template: "{{body}}"}}
model: gpt-4o-mini
backend: {{name: online, settings: {{sandbox: true}}}}
sampling: {{max_tokens: 16}}
output: {{choice: {LABELS}}}
"""


def prompt(i: int) -> str:
    return f"ticket {i}: my billing is wrong" if i % 2 else f"ticket {i}: the app has a bug"


def work(n: int, prompts: list[str] | None = None) -> ShardWork:
    plan = RequestPlan.from_spec(parse_spec(SPEC))
    items = pa.table(
        {"request_id": [f"{i:064x}" for i in range(n)], "user_prompt": prompts or [prompt(i) for i in range(n)]}
    )
    return ShardWork("online_job", "s00001", 1, "online_job:s00001:1", plan, items)


def executor(**settings: Any) -> OnlineExecutor:
    ex = create_executor(BackendSpec(name="online", settings={"sandbox": True, **settings}))
    assert isinstance(ex, OnlineExecutor)
    return ex


def chat_log(admin: SandboxAdmin) -> list[dict[str, Any]]:
    return [r for r in admin.requests() if r["path"] == CHAT]


def by_request(log: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for entry in sorted(log, key=lambda r: r["monotonic"]):
        grouped[entry["request_key"]].append(entry)
    return grouped


def test_registered_as_a_stream_executor_without_batch_limits(admin):
    assert "online" in names() and batch_limits("online") == (None, None)
    ex = executor()
    assert isinstance(ex, StreamExecutor) and ex.pricing == "online"
    with pytest.raises(ConfigError, match="concurency"):
        create_executor(BackendSpec(name="online", settings={"sandbox": True, "concurency": 3}))


def test_needs_a_key_unless_told_there_is_none(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        create_executor(BackendSpec(name="online", settings={"base_url": "http://127.0.0.1:9/v1"}))
    ex = create_executor(
        BackendSpec(name="online", settings={"base_url": "http://127.0.0.1:9/v1", "api_key_env": None})
    )
    assert ex.name == "online"


@pytest.mark.parametrize("transport, n", [("http", 200), ("sdk", 60)])
def test_all_succeed_matched_by_id_and_flushed_in_parts(admin, transport, n):
    tables = list(executor(transport=transport, concurrency=16, flush_every=48).run(work(n)))
    assert len(tables) >= n // 48 and all(t.schema == RAW_RESULT_SCHEMA for t in tables)
    rows = pa.concat_tables(tables).to_pylist()
    assert sorted(r["request_id"] for r in rows) == [f"{i:064x}" for i in range(n)]
    for row in rows:
        i = int(row["request_id"], 16)
        assert row["http_status"] == 200 and row["finish_reason"] == "stop"
        assert json.loads(row["output_text"]) == {"label": "billing" if i % 2 else "bug"}  # the answer to *its* prompt
        assert row["input_tokens"] > 0 and row["output_tokens"] > 0 and row["provider_request_id"].startswith("req_")
        assert json.loads(row["raw_payload"])["object"] == "chat.completion"
    # every 200 billed exactly once, and each billed completion is a row
    ledger = admin.ledger()
    assert len(ledger) == n and all(e["mode"] == "online" for e in ledger)
    assert sorted(e["completion_id"] for e in ledger) == sorted(json.loads(r["raw_payload"])["id"] for r in rows)
    assert len({r["request_key"] for r in chat_log(admin)}) == n
    assert max(r["retry_count"] for r in chat_log(admin)) == 0


def test_429_storm_honours_retry_after_ms(admin):
    admin.set_scenario("rate_limit", times=30, retry_after_ms=300, on=["chat_completions"])
    rows = pa.concat_tables(list(executor(concurrency=8, max_attempts_per_request=8).run(work(20)))).to_pylist()
    assert len(rows) == 20 and all(r["http_status"] == 200 for r in rows)
    log = chat_log(admin)
    assert sum(r["status"] == 429 for r in log) == 30
    checked = 0
    for attempts in by_request(log).values():
        assert attempts[-1]["status"] == 200
        assert [a["retry_count"] for a in attempts] == list(range(len(attempts)))
        for before, after in zip(attempts, attempts[1:]):
            assert before["status"] == 429
            assert after["monotonic"] - before["monotonic"] >= 0.3
            checked += 1
    assert checked >= 20


def test_backoff_without_a_header_is_jittered_and_bounded(admin):
    admin.set_scenario("server_error", times=24, on=["chat_completions"])  # a 500 carries no retry-after
    # more attempts than there are faults: however the 24 fall on the 6 requests, every request ends in a 200
    ex = executor(concurrency=6, max_attempts_per_request=25, backoff_base_s=0.1, backoff_max_s=0.2)
    drawn: dict[str, list[tuple[int, float]]] = defaultdict(list)  # prompt -> (attempt, wait drawn after it)
    current = threading.local()
    one, delay = ex._one, ex._delay

    def one_noted(request_id: str, prompt: str, *rest: Any) -> Any:
        current.prompt = prompt
        return one(request_id, prompt, *rest)

    def delay_noted(attempt: int, reply: Reply) -> tuple[float, bool]:
        wait, said = delay(attempt, reply)
        drawn[current.prompt].append((attempt, wait))
        return wait, said

    ex._one, ex._delay = one_noted, delay_noted  # type: ignore[method-assign]
    items = work(6)
    rows = pa.concat_tables(list(ex.run(items))).to_pylist()
    assert len(rows) == 6 and all(r["http_status"] == 200 for r in rows)
    keys = {_messages_key(chat_messages(items.plan, p)): p for p in items.items.column("user_prompt").to_pylist()}
    waits = []
    for key, attempts in by_request(chat_log(admin)).items():
        noted = drawn[keys[key]]
        assert [a for a, _ in noted] == list(range(1, len(attempts)))  # one wait after each failed attempt
        for (before, after), (n, wait) in zip(zip(attempts, attempts[1:]), noted):
            assert before["status"] == 500 and before["retry_count"] == n - 1
            assert 0 <= wait <= min(0.2, 0.1 * 2 ** (n - 1))  # full jitter below the exponential ceiling
            # the wait was kept: the retry reached the sandbox no sooner (its clock and ours are the host's)
            assert after["monotonic"] - before["monotonic"] >= wait - 0.001
            waits.append(wait)
    assert len(waits) == sum(map(len, drawn.values())) == 24
    assert statistics.pstdev(waits) > 0.01  # not one fixed delay


def test_retries_spent_leave_a_transient_row(admin):
    admin.set_scenario("server_error", times=10_000, on=["chat_completions"])
    rows = pa.concat_tables(list(executor(max_attempts_per_request=3, backoff_base_s=0.01).run(work(4)))).to_pylist()
    assert [(r["http_status"], r["error_code"]) for r in rows] == [(500, "server_error")] * 4
    assert all(r["output_text"] is None and "server_error" in r["error_message"] for r in rows)
    assert all(len(a) == 3 for a in by_request(chat_log(admin)).values())
    assert admin.ledger() == []


def test_line_errors_are_retried_per_request(admin):
    admin.set_scenario("line_errors", rate=1.0, times=1)
    rows = pa.concat_tables(list(executor(backoff_base_s=0.01).run(work(10)))).to_pylist()
    assert all(r["http_status"] == 200 for r in rows)
    assert [[a["status"] for a in v] for v in by_request(chat_log(admin)).values()] == [[500, 200]] * 10
    assert len(admin.ledger()) == 10


def test_configured_rpm_bounds_the_observed_request_rate(admin):
    rpm, n = 600, 40  # 10 requests/s, bursts of at most one second's worth
    tables = list(executor(rpm=rpm, concurrency=16, flush_every=1000, flush_interval_s=0.5).run(work(n)))
    assert len(tables) >= 3  # flushed on the interval, not only at the end
    times = sorted(r["monotonic"] for r in chat_log(admin))
    rate, burst = rpm / 60, rpm / 60
    for i in range(len(times)):
        for j in range(i + 1, len(times)):
            assert j - i + 1 <= burst + rate * (times[j] - times[i]) + 2, (i, j)  # + 2: arrival jitter
    assert times[-1] - times[0] >= (n - burst) / rate * 0.9


def test_poison_is_a_row_and_never_retried(admin):
    prompts = [prompt(i) for i in range(8)]
    prompts[3] = "this row is [[sandbox:poison]]"
    rows = {r["request_id"]: r for r in pa.concat_tables(list(executor().run(work(8, prompts)))).to_pylist()}
    bad = rows[f"{3:064x}"]
    assert bad["http_status"] == 400 and bad["error_code"] == "context_length_exceeded"
    assert bad["output_text"] is None and "poison" in bad["error_message"]
    assert sum(r["http_status"] == 200 for r in rows.values()) == 7
    assert sorted(r["status"] for r in chat_log(admin)) == [200] * 7 + [400]


def _no_thread_left_over(before: int) -> None:
    """The run's threads end: polled to a generous deadline (a loaded machine is slow to end one, not wrong)."""
    deadline = time.monotonic() + 30
    while threading.active_count() > before:
        assert time.monotonic() < deadline, f"threads left over: {[t.name for t in threading.enumerate()]}"
        time.sleep(0.02)


def test_bad_key_stops_the_run_at_once_without_spending_other_budgets(admin, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-sandbox-bad")
    before = threading.active_count()
    started = time.monotonic()
    tables: list[pa.Table] = []
    with pytest.raises(SystemicError) as err:
        for table in executor(concurrency=16).run(work(200)):
            tables.append(table)
    assert (
        time.monotonic() - started < 60
    )  # a generous bound: a worker left hanging would hold it 121 s (timeout_s + 1)
    assert "sk-sandbox-bad" not in str(err.value) and err.value.code == "invalid_api_key"
    log = chat_log(admin)
    assert all(r["status"] == 401 for r in log) and len(log) <= 32  # far fewer than the 200 items
    assert all(r["retry_count"] == 0 for r in log) and tables == []
    _no_thread_left_over(before)


def test_closing_the_iterator_early_stops_the_workers(admin):
    before = threading.active_count()
    run = executor(concurrency=8, flush_every=10).run(work(400))
    first = next(run)
    run.close()
    assert first.num_rows >= 10
    _no_thread_left_over(before)
    assert len(chat_log(admin)) < 400


def reply(status: int | None, body: Any = None, **headers: str) -> Reply:
    data = body if isinstance(body, bytes) else json.dumps(body).encode() if body is not None else b""
    return Reply(status, dict(headers), data, failure=None if status else "timeout")


def err(code: str | None, type_: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": "m", "type": type_, "param": None, "code": code}}


@pytest.mark.parametrize(
    "given, kind",
    [
        (reply(200, {}), "ok"),
        (reply(400, err("context_length_exceeded")), "poison"),
        (reply(422, err(None)), "poison"),
        (reply(401, err("invalid_api_key")), "systemic"),
        (reply(403, err(None)), "systemic"),
        (reply(404, err("model_not_found")), "systemic"),
        (reply(429, err("insufficient_quota", "insufficient_quota")), "systemic"),
        (reply(429, err("rate_limit_exceeded", "requests")), "transient"),
        (reply(408, err(None)), "transient"),
        (reply(409, err(None)), "transient"),
        (reply(503, b"not json"), "transient"),
        (reply(500, err("x"), **{"x-should-retry": "false"}), "poison"),
        (reply(400, err("x"), **{"x-should-retry": "true"}), "transient"),
        (reply(None), "transient"),
    ],
)
def test_classification(given, kind):
    assert classify(given).kind == kind


def test_retry_after_headers():
    assert retry_after_s({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert retry_after_s({"retry-after": "2"}) == 2.0
    soon = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 30))
    assert 25 <= (retry_after_s({"retry-after": soon}) or 0) <= 31
    assert retry_after_s({}) is None and retry_after_s({"retry-after": "soon"}) is None


def test_body_is_the_batch_body_plus_extra_body():
    plan = RequestPlan.from_spec(parse_spec(SPEC))
    builder = BodyBuilder(plan, {"structured_outputs": {"choice": LABELS}, "temperature": 0.5})
    body = json.loads(builder.data('say "hi" \u00e9'))
    assert body == {
        **body_settings(plan),
        "temperature": 0.5,
        "structured_outputs": {"choice": LABELS},
        "messages": chat_messages(plan, 'say "hi" \u00e9'),
    }
    assert builder.estimate_tokens("x" * 400) >= 100 + 16


@pytest.mark.parametrize(
    "text, seconds",
    [("1s", 1), ("6m0s", 360), ("120ms", 0.12), ("1m30.5s", 90.5), ("2", 2), ("", None), ("soon", None)],
)
def test_reset_durations(text, seconds):
    assert parse_duration(text) == (pytest.approx(seconds) if seconds is not None else None)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_limiter_tightens_from_headers_and_holds_when_nothing_is_left():
    clock, stop = FakeClock(), threading.Event()
    limiter = RateLimiter(rpm=6000, clock=clock)
    limiter.observe({"x-ratelimit-limit-requests": "120", "x-ratelimit-remaining-requests": "100"})
    assert limiter.limits == {"requests": 120}
    limiter.observe({"x-ratelimit-limit-requests": "100000"})  # never looser than configured
    assert limiter.limits == {"requests": 120}
    assert limiter.acquire(1, stop) and limiter.acquire(1, stop)  # one second's worth: 2 requests
    stop.set()
    assert not limiter.acquire(1, stop)  # the third must wait, and gives up when told to stop
    clock.now = 1.0
    assert limiter.acquire(1, threading.Event())
    limiter.observe(
        {"x-ratelimit-limit-tokens": "6000", "x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "20s"}
    )
    assert limiter.limits == {"requests": 120, "tokens": 6000}
    clock.now = 10.0
    assert not limiter.acquire(1, stop)  # held until the provider's reset
    clock.now = 21.0
    assert limiter.acquire(50, threading.Event())


def test_http_transport_resends_once_on_a_keep_alive_connection_the_server_closed():
    """A server that drops the connection after each answer (without saying so): the next request is resent on a
    fresh connection instead of failing."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from batch_pipeline.executors.online.transport import HttpTransport

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 - stdlib name
            self.rfile.read(int(self.headers["content-length"]))
            data = b'{"ok": true}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            self.close_connection = True  # hang up, although the response promised keep-alive

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        plan = RequestPlan.from_spec(parse_spec(SPEC))
        transport = HttpTransport(f"http://127.0.0.1:{server.server_address[1]}/v1", None, 5, BodyBuilder(plan, None))
        for _ in range(3):
            time.sleep(0.05)  # let the server close its end
            got = transport.send("hi", 0)
            assert (got.status, got.body) == (200, b'{"ok": true}'), got
        transport.close()
    finally:
        server.shutdown()
        server.server_close()


def _completion_ids(table: pa.Table) -> set[str]:
    return {json.loads(payload)["id"] for payload in table.column("raw_payload").to_pylist()}


def _billed(admin: SandboxAdmin) -> set[str]:
    return {e["completion_id"] for e in admin.ledger()}


def _assert_nothing_sent_after(admin: SandboxAdmin, sent: int) -> None:
    time.sleep(0.5)  # at 10 requests/s, a worker still going would have sent ~5 more by now
    assert len(chat_log(admin)) == sent, "a request was sent after the run was left"


def test_closing_mid_run_keeps_the_finished_unyielded_rows_and_sends_nothing_more(admin):
    # 10 requests/s, a table every 5 rows: the workers go on while the consumer holds the first table
    ex = executor(concurrency=4, rpm=600, flush_every=5, flush_interval_s=600)
    shard = work(100)
    run = ex.run(shard)
    first = next(run)
    deadline = time.monotonic() + 60  # more requests answered (billed) than yielded: their rows wait in the executor
    while len(_billed(admin)) <= first.num_rows:
        assert time.monotonic() < deadline, "no request was answered after the first table"
        time.sleep(0.02)
    run.close()
    sent = len(chat_log(admin))
    kept = ex.take_unflushed(shard.key)
    _assert_nothing_sent_after(admin, sent)
    assert kept is not None and kept.schema == RAW_RESULT_SCHEMA and kept.num_rows > 0
    billed = _billed(admin)
    assert first.num_rows == 5 and 5 + kept.num_rows == len(billed) == sent < 100  # every request sent was billed
    assert _completion_ids(kept) == billed - _completion_ids(first)  # exactly the finished rows not yielded
    assert set(kept.column("request_id").to_pylist()).isdisjoint(first.column("request_id").to_pylist())
    assert ex.take_unflushed(shard.key) is None  # handed over once
    assert ex.take_unflushed("online_job:s00002:1") is None


def test_an_interrupt_raised_inside_the_run_keeps_every_finished_row(admin):
    """As a SIGTERM does under Dagster: the interrupt is raised in the main thread while it waits inside run()."""
    import _thread

    # 100 requests at 120 rpm take ~50 s: the interrupt (after ~1.5 s) lands inside the run even when a loaded
    # machine starves the interrupting thread (at 600 rpm the run once ended first, in 9 s)
    ex = executor(concurrency=4, rpm=120, flush_every=1000, flush_interval_s=600)
    shard, other = work(100), work(3)
    other.key = "online_job:s00002:1"
    assert pa.concat_tables(list(ex.run(other))).num_rows == 3  # a run that ended keeps nothing back
    before = len(admin.ledger())

    def interrupt_once_answers_are_in() -> None:  # waits on the event (answers billed), not on a timer
        deadline = time.monotonic() + 120
        while len(admin.ledger()) < before + 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        _thread.interrupt_main()

    # interrupt_main() does nothing unless Python handles SIGINT: an earlier test in this worker process (Dagster's
    # interrupt handling around a run) can leave another handler there, and then the run was never interrupted
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Thread(target=interrupt_once_answers_are_in, daemon=True)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            next(ex.run(shard))  # nothing is flushed by size or time: only the interrupt ends this wait
    finally:
        signal.signal(signal.SIGINT, previous)
    timer.join()
    sent = len(chat_log(admin))
    kept = ex.take_unflushed(shard.key)
    _assert_nothing_sent_after(admin, sent)
    assert kept is not None and 0 < kept.num_rows == len(admin.ledger()) - before == sent - 3 < 100
    assert _completion_ids(kept) == {e["completion_id"] for e in admin.ledger()[before:]}
    assert ex.take_unflushed(other.key) is None and ex.take_unflushed(shard.key) is None
