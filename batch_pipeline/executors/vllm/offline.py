"""Self-hosted vLLM, in process (stream shape): the shard runs inline on an engine loaded once per process.

- **One engine per process**, built on the first ``run()`` and kept in a module-level cache keyed by the
  engine settings, so a step that takes many shards (a GPU pod) loads the model once.
- **Stable prefix first**: each item is rendered through the model's chat template as (system, user);
  ``enable_prefix_caching=True`` lets every request after the first reuse the system prompt's KV blocks.
- **Output contract in the decoder**: ``SamplingParams(structured_outputs=StructuredOutputsParams(choice=labels
  | json=schema))``; a choice result is the bare label. ``max_tokens`` is the plan's, tightened for a choice to
  the longest label in bytes + 1 (EOS), the most a label can take whatever its tokenization.
- **Order**: items go into length buckets (longest first), shuffled with a seed within a bucket; a short
  pre-flight pass runs the ``preflight_longest`` longest prompts alone first, so an out-of-memory or a
  misconfigured ``max_model_len`` fails in seconds (``SystemicError``) rather than an hour in. It also puts
  the shared prefix in the cache before the bulk arrives. A prompt longer than ``max_model_len`` is a poison
  row (``context_length_exceeded``), not a crash. Items go into the engine in that order, at most twice its
  ``max_num_seqs`` at a time, topped up before each step: a waiting request holds its tokens and its grammar
  matcher in the engine, so a large shard is never handed over whole.
- **Results** are ``RAW_RESULT_SCHEMA`` tables flushed every ``flush_every`` items or ``flush_interval_s``
  seconds; ``finish_reason == "length"`` is kept as is (the runner's validation makes it invalid).
- **Preemption**: while ``run()`` drives the engine from the main thread, SIGTERM (and SIGINT) only set a
  flag: the unfinished requests are aborted, the finished ones are flushed, and then the previous handler
  runs (Dagster's raises its interrupt; without one a ``TransientError`` unwinds), so the runner's lease is
  released on the way out and the next attempt sends only what is left.
- **Metrics** per shard (prompt, cached and generated tokens, tokens/s, engine time vs wall time) are logged
  and kept in ``executor.metrics[shard_id]`` / ``executor.last_metrics`` for the asset metadata.

The engine and its settings live in ``vllm_engine``, prompt rendering, sampling parameters and item order in
``vllm_prompts``.
"""

import json
import logging
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from batch_pipeline.core.errors import SystemicError, TransientError
from batch_pipeline.core.ledger.executor import ShardWork, raw_table
from batch_pipeline.executors.openai.embeddings import is_embedding
from batch_pipeline.executors.vllm.embed import embed_rows, pooling_settings
from batch_pipeline.executors.vllm.engine import VllmSettings, load_engine, release_engines
from batch_pipeline.executors.vllm.prompts import PromptRenderer, order_items, sampling_params

log = logging.getLogger(__name__)


class _StopSignals:
    """While active (main thread only), SIGTERM/SIGINT set ``received`` instead of interrupting the engine."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "_StopSignals":
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                prev = signal.getsignal(sig)
                if prev is not signal.SIG_IGN:
                    self._previous[sig] = prev
                    signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.received is None:
            log.warning("vllm: %s received; stopping after the current engine step", signal.Signals(signum).name)
        self.received = signum

    def __exit__(self, *exc: Any) -> None:
        for sig, prev in self._previous.items():
            signal.signal(sig, prev)
        self._previous.clear()

    def redeliver(self) -> None:
        """Restore the handlers, then hand the signal on (Dagster's handler raises its interrupt)."""
        signum = self.received
        previous = dict(self._previous)
        self.__exit__()
        handler = previous.get(signum) if signum is not None else None
        if callable(handler):
            handler(signum, None)
        raise TransientError(
            f"preempted by {signal.Signals(signum or signal.SIGTERM).name}: finished results "
            "were flushed; the rest stays pending",
            code="preempted",
        )


class VllmOfflineExecutor:
    """StreamExecutor over an in-process vLLM engine."""

    name = "vllm"
    pricing = "self_hosted"
    settings_model = VllmSettings

    def __init__(self, settings: VllmSettings) -> None:
        self.settings = settings
        self.metrics: dict[str, dict[str, Any]] = {}
        self.last_metrics: dict[str, Any] = {}

    def run(self, work: ShardWork) -> Iterator[pa.Table]:
        s = self.settings
        ids = work.items.column("request_id").to_pylist()
        if not ids:
            return
        if is_embedding(work.plan):  # a pooling model: LLM.embed (executors/vllm/embed.py)
            yield from embed_rows(load_engine(pooling_settings(s)), work, s.flush_every)
            return
        started = time.monotonic()
        llm = load_engine(s)
        engine = llm.llm_engine
        shard = _Prepared.of(llm, work, s)
        preflight, ordered = order_items(shard.lengths, s.length_bucket_tokens, s.seed, s.preflight_longest)
        m = _Metrics(work, started)
        m.prep_s = time.monotonic() - started
        rows: list[tuple] = []
        live: dict[str, int] = {}  # engine request id -> item index, while in the engine
        window = _window(engine)
        with _StopSignals() as stops:
            try:
                for phase, indexes in (("preflight", preflight), ("bulk", ordered)):
                    feed = _Feed(shard, indexes, window)
                    try:
                        yield from self._drive(engine, feed, live, rows, m, stops)
                    except Exception as exc:
                        live.clear()
                        release_engines()  # a failed engine is not reused
                        yield from m.flushed(rows)
                        raise _engine_failure(exc, phase, len(indexes), max(shard.lengths), m, work) from exc
                    if stops.received is not None:
                        _abort(engine, live)
                        yield from m.flushed(rows)
                        m.finish(self, interrupted=True)
                        stops.redeliver()
                    m.mark(phase)
            finally:
                _abort(engine, live)  # the consumer stopped early: nothing of this shard stays in the engine
        yield from m.flushed(rows)
        m.finish(self)

    def _drive(
        self,
        engine: Any,
        feed: "_Feed",
        live: dict[str, int],
        rows: list[tuple],
        m: "_Metrics",
        stops: _StopSignals,
    ) -> Iterator[pa.Table]:
        """Step the engine until the phase's requests are done (or a stop signal came), topping it up from ``feed``
        before each step; ``rows`` are flushed every ``flush_every`` items and every ``flush_interval_s``, and what
        is left in it stays for the caller."""
        s, shard = self.settings, feed.shard
        while stops.received is None:
            rows.extend(feed.top_up(engine, live))
            if not live:
                break
            t0 = time.monotonic()
            outputs = engine.step()
            m.engine_s += time.monotonic() - t0
            for out in outputs:
                if out.finished and out.request_id in live:
                    row = _row(shard.ids[live.pop(out.request_id)], out)
                    if row is not None:
                        rows.append(row)
                        m.add(row)
            while len(rows) >= s.flush_every:  # a part every flush_every items
                yield from m.flushed(rows[: s.flush_every])
                del rows[: s.flush_every]
                m.last_flush = time.monotonic()
            if rows and time.monotonic() - m.last_flush >= s.flush_interval_s:
                yield from m.flushed(rows[:])
                rows.clear()
                m.last_flush = time.monotonic()


def _window(engine: Any) -> int:
    """How many of a shard's requests are in the engine at once: twice what it runs at a time, so its queue never
    runs dry between two top-ups (one step finishes at most ``max_num_seqs``). A waiting request costs memory (its
    token lists, its grammar matcher: on CPU, 6,000 ~1,000-token prompts with structured outputs peaked 144 MiB
    higher handed over at once), so a shard of 50,000 items must not be."""
    seqs = getattr(getattr(engine, "vllm_config", None), "scheduler_config", None)
    return 2 * max(1, int(getattr(seqs, "max_num_seqs", None) or 256))


class _Feed:
    """A phase's items not yet in the engine, handed over in length order, a window at a time."""

    def __init__(self, shard: "_Prepared", indexes: list[int], window: int) -> None:
        self.shard, self.indexes, self.window, self.at = shard, indexes, window, 0

    def top_up(self, engine: Any, live: dict[str, int]) -> list[tuple]:
        """Put items in the engine until ``window`` are live (or none is left); the error rows of those refused."""
        errors: list[tuple] = []
        while len(live) < self.window and self.at < len(self.indexes):
            take = self.indexes[self.at : self.at + self.window - len(live)]
            self.at += len(take)
            errors.extend(self.shard.submit(engine, take, live))
        return errors


@dataclass
class _Prepared:
    """A shard's prompts as the engine takes them: token IDs, their lengths, the render and sampling parameters."""

    key: str
    ids: list[str]
    prompts: list[list[int]]
    lengths: list[int]
    max_len: int
    render: Callable[[dict[str, Any]], Any]
    params: Any

    @classmethod
    def of(cls, llm: Any, work: ShardWork, s: VllmSettings) -> "_Prepared":
        renderer = PromptRenderer.for_plan(llm.get_tokenizer(), work.plan)
        prompts = renderer.token_ids(work.items.column("user_prompt").to_pylist())
        # as LLM.generate does: rendered engine inputs (raw prompts are deprecated in vLLM 0.32), else raw
        render = getattr(llm, "_preprocess_cmpl_one", None) or (lambda prompt: prompt)
        return cls(
            work.key,
            work.items.column("request_id").to_pylist(),
            prompts,
            [len(p) for p in prompts],
            llm.llm_engine.model_config.max_model_len,
            render,
            sampling_params(work.plan, s),
        )

    def submit(self, engine: Any, indexes: list[int], live: dict[str, int]) -> list[tuple]:
        """Put the items at ``indexes`` in the engine (``live``); the error rows of those it cannot take: a prompt
        longer than ``max_model_len`` or one the engine refuses is a poison row, not a crash."""
        errors = []
        for i in indexes:
            ext = f"{self.key}#{i}"
            if self.lengths[i] >= self.max_len:
                message = f"prompt is {self.lengths[i]} tokens; max_model_len is {self.max_len}"
                errors.append(_error_row(self.ids[i], ext, 400, "context_length_exceeded", message))
                continue
            try:
                engine.add_request(ext, self.render({"prompt_token_ids": self.prompts[i]}), self.params)
            except (ValueError, TypeError) as exc:
                errors.append(_error_row(self.ids[i], ext, 400, "invalid_request", str(exc)[:500]))
                continue
            live[ext] = i
        return errors


def _engine_failure(
    exc: Exception, phase: str, count: int, longest: int, m: "_Metrics", work: ShardWork
) -> SystemicError:
    """The engine failed: a stop for the job, saying when (the pre-flight's longest prompts, or how far in)."""
    where = (
        f"on the {count} longest prompts (up to {longest} tokens)"
        if phase == "preflight"
        else f"after {m.items} results"
    )
    return SystemicError(
        f"vLLM engine failed {where} of shard {work.shard_id}: {exc!r}; check "
        "max_model_len, max_num_batched_tokens, max_num_seqs and the memory settings",
        code="engine_failed",
    )


def _abort(engine: Any, live: dict[str, int]) -> None:
    """Abort the shard's unfinished requests and drain their final outputs (they stay pending)."""
    if not live:
        return
    try:
        engine.abort_request(list(live))
        while engine.has_unfinished_requests():
            engine.step()
    finally:
        live.clear()


def _row(request_id: str, out: Any) -> tuple | None:
    comp = out.outputs[0]
    if comp.finish_reason == "abort":
        return None  # stopped by us: the item stays pending
    prompt_tokens = len(out.prompt_token_ids or [])
    cached = out.num_cached_tokens or 0
    payload = json.dumps(
        {
            "id": out.request_id,
            "text": comp.text,
            "finish_reason": comp.finish_reason,
            "stop_reason": comp.stop_reason,
            "prompt_tokens": prompt_tokens,
            "cached_tokens": cached,
            "completion_tokens": len(comp.token_ids),
        },
        ensure_ascii=False,
        default=str,
    )
    return (
        request_id,
        200,
        comp.text,
        comp.finish_reason,
        prompt_tokens,
        cached,
        len(comp.token_ids),
        None,
        None,
        out.request_id,
        payload,
    )


def _error_row(request_id: str, ext: str, status: int, code: str, message: str) -> tuple:
    payload = json.dumps({"id": ext, "error": {"code": code, "message": message}})
    return (request_id, status, None, None, None, None, None, code, message, ext, payload)


class _Metrics:
    """Per-shard counters: tokens, engine time (inside ``step()``), time handed to the runner for flushes."""

    def __init__(self, work: ShardWork, started: float) -> None:
        self.work, self.started = work, started
        self.items = self.prompt = self.cached = self.generated = 0
        self.engine_s = self.flush_s = self.prep_s = 0.0
        self.reasons: Counter[str] = Counter()
        self.phases: dict[str, float] = {}
        self.last_flush = time.monotonic()  # when rows were last handed to the runner

    def add(self, row: tuple) -> None:
        self.items += 1
        self.prompt += row[4] or 0
        self.cached += row[5] or 0
        self.generated += row[6] or 0
        self.reasons[row[3] or "none"] += 1

    def mark(self, phase: str) -> None:
        self.phases[phase] = round(time.monotonic() - self.started, 3)

    def flushed(self, rows: list[tuple]) -> Iterator[pa.Table]:
        if rows:
            t0 = time.monotonic()
            yield raw_table(rows)
            self.flush_s += time.monotonic() - t0

    def finish(self, executor: VllmOfflineExecutor, interrupted: bool = False) -> None:
        wall = max(time.monotonic() - self.started, 1e-9)
        share = round(self.cached / self.prompt, 4) if self.prompt else 0.0
        d = {
            "items": self.items,
            "prompt_tokens": self.prompt,
            "cached_tokens": self.cached,
            "generated_tokens": self.generated,
            "cached_share": share,
            "wall_s": round(wall, 3),
            "engine_s": round(self.engine_s, 3),
            "prep_s": round(self.prep_s, 3),
            "flush_s": round(self.flush_s, 3),
            "engine_share": round(self.engine_s / wall, 4),
            "tokens_per_s": round((self.prompt + self.generated) / wall, 1),
            "generated_tokens_per_s": round(self.generated / wall, 1),
            "finish_reasons": dict(self.reasons),
            "phases_s": self.phases,
            "interrupted": interrupted,
        }
        executor.metrics[self.work.shard_id] = executor.last_metrics = d
        log.info(
            "vllm %s: %d items, %d prompt tokens (%d cached, %.0f%%), %d generated; %.1f tok/s; engine %.2f s "
            "of %.2f s wall%s",
            self.work.key,
            self.items,
            self.prompt,
            self.cached,
            100 * d["cached_share"],
            self.generated,
            d["tokens_per_s"],
            self.engine_s,
            wall,
            " (interrupted)" if interrupted else "",
        )
