"""Online executor: any OpenAI-compatible ``/chat/completions`` endpoint (OpenAI, a vLLM server, the sandbox), and
``/embeddings`` for an embeddings job (``output.embedding``; online/embeddings.py).

``run(work)`` sends every item with bounded concurrency (worker threads; measured faster than asyncio with the
SDK, see benchmarks/README.md), under a requests/tokens limiter, and yields ``RAW_RESULT_SCHEMA`` tables every
``flush_every`` results or ``flush_interval_s`` seconds. Per request: 429/408/409/5xx and connection failures are
retried (``retry-after-ms``, then ``retry-after``, up to a cap; else full-jitter exponential backoff); a 4xx is a
poison row, not retried; a bad key, a missing model or no credit raises ``SystemicError`` at once and cancels the
pending work. Results carry their ``request_id``; order is completion order.

A run left early (an exception raised in it, such as the interrupt a SIGTERM becomes, or closed by its consumer)
sends nothing more, lets the requests in flight finish (up to ``timeout_s``) and keeps the finished rows it has not
yielded for ``take_unflushed(work.key)``: those requests were paid for, and the runner stores them before it stops.
"""

import logging
import random
import threading
import time
from collections.abc import Iterator
from typing import Any, Literal

import pyarrow as pa
from pydantic import Field

from batch_pipeline.core.errors import ConfigError, SystemicError
from batch_pipeline.core.ledger.executor import ShardWork
from batch_pipeline.executors.endpoint import resolve_endpoint
from batch_pipeline.executors.online.embeddings import (
    EMBEDDINGS_PATH,
    EmbeddingBodyBuilder,
    embedding_success_row,
    rows_table,
)
from batch_pipeline.executors.online.pool import RunPool
from batch_pipeline.executors.online.rate_limit import RateLimiter
from batch_pipeline.executors.online.replies import classify, error_row, success_row
from batch_pipeline.executors.online.transport import BodyBuilder, HttpTransport, Reply, SdkTransport, Transport
from batch_pipeline.executors.openai.embeddings import is_embedding
from batch_pipeline.executors.provider_errors import redact, retry_after_s
from batch_pipeline.executors.settings import ProviderSettings

log = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://api.openai.com/v1"


class OnlineSettings(ProviderSettings):
    """``backend.settings`` of ``online``. The key is read from the environment, never from the spec."""

    base_url: str | None = Field(default=None, description=f"default {DEFAULT_BASE_URL}")
    api_key_env: str | None = Field(default="OPENAI_API_KEY", description="None: send no key (a local vLLM)")
    transport: Literal["http", "sdk"] = Field(default="http", description="http: stdlib keep-alive; sdk: openai")
    concurrency: int = Field(default=16, ge=1, le=1024)
    rpm: float | None = Field(default=None, gt=0, description="requests per minute (also learned from headers)")
    tpm: float | None = Field(default=None, gt=0, description="tokens per minute: body bytes / 4 + max_tokens")
    max_attempts_per_request: int = Field(default=4, ge=1)
    retry_after_cap_s: float = Field(default=60, ge=0)
    backoff_base_s: float = Field(default=0.5, ge=0)
    backoff_max_s: float = Field(default=8, ge=0)
    flush_every: int = Field(default=256, ge=1)
    flush_interval_s: float = Field(default=5, gt=0)
    progress_interval_s: float = Field(default=10, gt=0)
    extra_body: dict[str, Any] = Field(default_factory=dict, description="merged into every body (vLLM options)")
    pricing: str = Field(default="online", description="which price applies to the results")


class _Stats:
    """Counters shared by the workers (read for progress logs)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent = self.retries = self.done = 0


class OnlineExecutor:
    """StreamExecutor for OpenAI-compatible chat completions."""

    name = "online"
    settings_model = OnlineSettings

    def __init__(self, settings: OnlineSettings) -> None:
        self.settings = settings
        self.pricing = settings.pricing
        base_url, api_key = resolve_endpoint(
            self.name,
            sandbox=settings.sandbox,
            base_url=settings.base_url or DEFAULT_BASE_URL,
            api_key_env=settings.api_key_env,
            sandbox_path="/v1",
            key_required=bool(settings.api_key_env),
        )
        assert base_url is not None
        if not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"backend online: base_url must be an http(s) URL, not {base_url!r}")
        self.base_url = base_url
        self._api_key = api_key
        self._unflushed: dict[str, pa.Table] = {}  # work key -> finished rows a left run did not yield
        self._unflushed_lock = threading.Lock()

    def take_unflushed(self, key: str) -> pa.Table | None:
        """The finished rows an interrupted ``run`` of ``key`` held but did not yield (once; None if there are none)."""
        with self._unflushed_lock:
            return self._unflushed.pop(key, None)

    def _keep_unflushed(self, key: str, rows: list[tuple[Any, ...]]) -> None:
        table = rows_table(rows)
        with self._unflushed_lock:
            earlier = self._unflushed.get(key)
            self._unflushed[key] = table if earlier is None else pa.concat_tables([earlier, table])
        log.warning("online %s: stopped early; %d finished results kept for the runner to store", key, len(rows))

    def _transport(self, builder: BodyBuilder | EmbeddingBodyBuilder) -> Transport:
        s = self.settings
        if s.transport == "sdk":
            return SdkTransport(self.base_url, self._api_key, s.timeout_s, s.concurrency, builder)
        return HttpTransport(self.base_url, self._api_key, s.timeout_s, builder)

    def _delay(self, attempt: int, reply: Reply) -> tuple[float, bool]:
        """(seconds to wait before the next attempt, whether the provider said so)."""
        said = retry_after_s(reply.headers)
        if said is not None:
            return min(said, self.settings.retry_after_cap_s), True
        ceiling = min(self.settings.backoff_max_s, self.settings.backoff_base_s * 2 ** (attempt - 1))
        return random.uniform(0, ceiling), False

    def run(self, work: ShardWork) -> Iterator[pa.Table]:
        """Send every item of the shard; yield result tables as they fill; raise SystemicError to stop the job."""
        s = self.settings
        ids = work.items.column("request_id").to_pylist()
        prompts = work.items.column("user_prompt").to_pylist()
        total = len(ids)
        if total == 0:
            return
        builder = (
            EmbeddingBodyBuilder(work.plan, s.extra_body)
            if is_embedding(work.plan)
            else BodyBuilder(work.plan, s.extra_body)
        )
        limiter = RateLimiter(s.rpm, s.tpm)
        pool = RunPool(iter(zip(ids, prompts, strict=True)))
        stats = _Stats()
        shared = self._transport(builder) if s.transport == "sdk" else None
        pool.threads = [
            threading.Thread(
                target=self._worker, args=(pool, work, shared, builder, limiter, stats), name=f"online-{i}", daemon=True
            )
            for i in range(min(s.concurrency, total))
        ]
        for thread in pool.threads:
            thread.start()
        log.info("online %s: %d requests to %s, concurrency %d", work.key, total, self.base_url, len(pool.threads))
        started = time.monotonic()
        try:
            yield from self._flushes(pool, work, stats, total, started, limiter)
        finally:
            self._wind_down(pool, work.key, shared)
        self._progress(work, stats, total, started, limiter)
        if pool.failures:
            raise pool.failures[0]

    def _worker(
        self,
        pool: RunPool,
        work: ShardWork,
        shared: Transport | None,
        builder: BodyBuilder,
        limiter: RateLimiter,
        stats: _Stats,
    ) -> None:
        """One worker thread: take the next item, send it, buffer its row, until the items run out or the run stops."""
        transport = shared or self._transport(builder)
        try:
            while not pool.stop.is_set():
                item = pool.next_item()
                if item is None:
                    break
                row = self._one(item[0], item[1], transport, builder, limiter, pool.stop, stats)
                if row is not None:
                    if work.journal is not None:  # paid: durable before it is counted (core/run/journal.py)
                        work.journal(row)
                    pool.buffer.append(row)
                    pool.wake.set()
        except BaseException as exc:  # SystemicError, or a bug: stop the run and surface it
            pool.stop.set()
            pool.failures.append(exc)
        finally:
            if shared is None:
                transport.close()
            pool.ended.append(threading.current_thread().name)
            pool.wake.set()

    def _flushes(
        self, pool: RunPool, work: ShardWork, stats: _Stats, total: int, started: float, limiter: RateLimiter
    ) -> Iterator[pa.Table]:
        """The buffered rows as tables, every ``flush_every`` rows or ``flush_interval_s``, until the workers end."""
        s = self.settings
        last_flush = last_log = started
        buffer = pool.buffer
        while True:
            pool.wake.clear()
            done = pool.done  # read first: a worker appends its rows before it ends
            now = time.monotonic()
            if buffer and (done or len(buffer) >= s.flush_every or now - last_flush >= s.flush_interval_s):
                last_flush = now
                n = min(len(buffer), s.flush_every)
                table = rows_table(buffer[:n])
                del buffer[:n]  # no call from here to the yield: nothing can be raised in between
                yield table
                continue
            if done:
                break
            if now - last_flush >= s.flush_interval_s:
                last_flush = now
            if now - last_log >= s.progress_interval_s:
                last_log = now
                self._progress(work, stats, total, started, limiter)
            pool.wake.wait(max(0.0, min(last_flush + s.flush_interval_s, last_log + s.progress_interval_s) - now))

    def _wind_down(self, pool: RunPool, key: str, shared: Transport | None) -> None:
        """Done, or left early: no worker takes another item or sends another attempt; the requests in flight
        finish and buffer their rows, which a run left early keeps for ``take_unflushed``."""
        timeout = self.settings.timeout_s + 1
        pool.stop.set()
        try:
            for thread in pool.threads:
                thread.join(timeout=timeout)
        finally:
            if shared is not None:
                shared.close()
            if pool.buffer:  # only a run left early holds rows here: a finished one yielded them all
                self._keep_unflushed(key, pool.buffer[:])
            if any(thread.is_alive() for thread in pool.threads):
                log.warning("online %s: requests still in flight after %.0f s; their results are lost", key, timeout)

    def _progress(self, work: ShardWork, stats: _Stats, total: int, started: float, limiter: RateLimiter) -> None:
        elapsed = max(time.monotonic() - started, 1e-9)
        log.info(
            "online %s: %d/%d done (%.1f/s), %d requests sent, %d retries, %.1f s waited on rate limits",
            work.key,
            stats.done,
            total,
            stats.done / elapsed,
            stats.sent,
            stats.retries,
            limiter.waited_s,
        )

    def _one(
        self,
        request_id: str,
        prompt: str,
        transport: Transport,
        builder: BodyBuilder | EmbeddingBodyBuilder,
        limiter: RateLimiter,
        stop: threading.Event,
        stats: _Stats,
    ) -> tuple[Any, ...] | None:
        """All attempts at one item: its row, or None when the run stopped first (nothing recorded)."""
        tokens = builder.estimate_tokens(prompt)
        attempts = self.settings.max_attempts_per_request
        for attempt in range(1, attempts + 1):
            if not limiter.acquire(tokens, stop) or stop.is_set():
                return None  # stopped: this attempt is never sent
            reply = transport.send(prompt, attempt - 1)
            with stats.lock:
                stats.sent += 1
            if reply.headers:
                limiter.observe(reply.headers)
            outcome = classify(reply)
            if outcome.kind == "ok":
                row = (
                    embedding_success_row(request_id, outcome.payload, reply.headers.get("x-request-id"))
                    if builder.path == EMBEDDINGS_PATH
                    else success_row(request_id, outcome, reply.headers)
                )
            elif outcome.kind == "systemic":
                raise SystemicError(
                    redact(
                        f"online endpoint {self.base_url} refused the job: HTTP {outcome.status} {outcome.code}: "
                        f"{outcome.message} (check the API key, model and account; then re-run to resume)",
                        self._api_key,
                    ),
                    code=outcome.code,
                )
            elif outcome.kind == "poison" or attempt == attempts:
                row = error_row(request_id, outcome, reply.headers, self._api_key)
            else:
                delay, said = self._delay(attempt, reply)
                if said and reply.status == 429:
                    limiter.pause(delay)  # the limit is shared: hold every worker, not only this one
                with stats.lock:
                    stats.retries += 1
                if stop.wait(delay):
                    return None
                continue
            with stats.lock:
                stats.done += 1
            return row
        return None
