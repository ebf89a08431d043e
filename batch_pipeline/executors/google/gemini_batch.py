"""Gemini Developer API batch mode (real ``google-genai`` SDK): upload, create, poll, download, cancel, find.

A shard attempt is one JSONL file (``{"key": request_id, "request": GenerateContentRequest}`` per line) uploaded
through the Files API's resumable protocol, then ``batches.create`` with the attempt key as ``display_name``; a
crash between "Google accepted the batch" and "we recorded its name" is repaired by listing batches and matching
the display name, never by creating again. Every ``JobState`` the SDK can return is mapped explicitly (an unknown
one is an error). Results are the ``responsesFile`` (one line per request, matched on ``key``).

An embeddings job (``output.embedding``) sends ``EmbedContentRequest`` lines (``embed_format.py``) through
``batches.create_embeddings`` (``models/M:asyncBatchEmbedContent``); its batch is then polled, fetched, cancelled,
found and discarded as any other, and its responses file yields the vector rows.

Expiry: a batch not finished within 48 h ends ``EXPIRED`` with **no results at all** (OpenAI and Anthropic keep
the finished part). ``fetch`` then yields nothing and the runner sends every item of the attempt again in the
next one; no item's budget is spent on it.

Retries are ours, not the SDK's: its retry policy ignores the server's requested wait (``google.rpc.RetryInfo``),
so the client is built with one attempt per call and ``_call`` retries transient errors, honouring that wait.
"""

import io
import json
import logging
import os
import queue
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import google.genai as genai
import httpx2
import pyarrow as pa
from google.genai import errors as genai_errors
from google.genai import types
from pydantic import Field

from batch_pipeline.core.error_table import Family, Where
from batch_pipeline.core.errors import BatchPipelineError, ConfigError, QuotaError, SystemicError, TransientError
from batch_pipeline.core.ledger.capacity import Dimension
from batch_pipeline.core.run.executor import BatchHandle, BatchState, BatchStatus, ShardWork
from batch_pipeline.core.run.threads import default_workers
from batch_pipeline.core.spec.quota import Retention
from batch_pipeline.executors.endpoint import resolve_endpoint
from batch_pipeline.executors.google.embed_format import embed_input_file, parse_any_stream
from batch_pipeline.executors.google.format import ERROR_INFO, contents_writer, request_template
from batch_pipeline.executors.openai.embeddings import is_embedding
from batch_pipeline.executors.provider_errors import classified, redact, retry_after_s, retry_wait_s
from batch_pipeline.executors.quota import QueueCapped
from batch_pipeline.executors.settings import BatchProviderSettings

log = logging.getLogger(__name__)

KEY_ENV, FALLBACK_KEY_ENV = "GEMINI_API_KEY", "GOOGLE_API_KEY"
INPUT_MIME = "jsonl"  # what the batch-mode docs upload with
RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"
_DOWNLOAD_QUEUE_CHUNKS = 16  # 1 MiB chunks held between the download thread and the parser
S = types.JobState
STATE_MAP = {
    S.JOB_STATE_QUEUED: BatchState.VALIDATING,
    S.JOB_STATE_PENDING: BatchState.VALIDATING,
    S.JOB_STATE_RUNNING: BatchState.RUNNING,
    S.JOB_STATE_UPDATING: BatchState.RUNNING,
    S.JOB_STATE_PAUSED: BatchState.RUNNING,  # Vertex-only; it resumes at the provider
    S.JOB_STATE_CANCELLING: BatchState.CANCELLING,
    S.JOB_STATE_SUCCEEDED: BatchState.COMPLETED,
    S.JOB_STATE_PARTIALLY_SUCCEEDED: BatchState.COMPLETED,
    S.JOB_STATE_FAILED: BatchState.FAILED,
    S.JOB_STATE_CANCELLED: BatchState.CANCELLED,
    S.JOB_STATE_EXPIRED: BatchState.EXPIRED,
}
REFUSED_STATES = frozenset({S.JOB_STATE_UNSPECIFIED})  # a batch in no state is an error, as an unknown one


class GeminiBatchSettings(BatchProviderSettings):
    """``backend.settings`` of ``gemini_batch``. The key is read from ``$GEMINI_API_KEY`` (``$GOOGLE_API_KEY``
    when that is unset), never from the spec. On the sandbox the base URL is ``$BATCH_PIPELINE_SANDBOX_URL``."""

    api_key_env: str | None = KEY_ENV
    api_version: str | None = Field(default=None, description="e.g. v1beta; default: the SDK's (v1)")


def _details(exc: genai_errors.APIError) -> list[dict[str, Any]]:
    details = exc.details.get("error", exc.details) if isinstance(exc.details, dict) else {}
    found = details.get("details") if isinstance(details, dict) else None
    return [d for d in found or [] if isinstance(d, dict)]


def _retry_delay(exc: genai_errors.APIError) -> float | None:
    """``RetryInfo.retryDelay`` ("30s", "0.05s"), else a ``retry-after`` header."""
    for detail in _details(exc):
        delay = detail.get("retryDelay") if detail.get("@type") == RETRY_INFO else None
        if isinstance(delay, str) and delay.endswith("s"):
            try:
                return max(0.0, float(delay[:-1]))
            except ValueError:
                pass
    headers = getattr(exc.response, "headers", None)
    return retry_after_s({k.lower(): v for k, v in headers.items()}) if headers is not None else None


def translate(
    exc: Exception,
    action: str,
    secret: str | None = None,
    *,
    where: Where = Where.CALL,
    dimension: Dimension | None = None,
) -> BatchPipelineError:
    """SDK exception -> our error class, by the one error table; secrets redacted. ``where=CREATE`` (with the
    ``dimension`` it fills) for the batch create."""
    if isinstance(exc, genai_errors.APIError):
        reason = next((d.get("reason") for d in _details(exc) if d.get("@type") == ERROR_INFO), None)
        status = exc.status or ""
        return classified(
            Family.GEMINI,
            "Gemini",
            action,
            exc.code or 0,
            status.lower() or None,
            exc.message or "",
            shown=status,
            reason=reason if isinstance(reason, str) else None,
            retry_after=_retry_delay(exc),
            where=where,
            dimension=dimension,
            secret=secret,
        )
    if isinstance(exc, httpx2.TransportError):
        return classified(
            Family.GEMINI,
            "Gemini",
            action,
            None,
            "connection_error",
            f"{type(exc).__name__}: {exc}",
            where=where,
            dimension=dimension,
            secret=secret,
        )
    if isinstance(exc, ValueError | KeyError) and action == "file upload":  # the upload session broke
        return TransientError(redact(f"Gemini {action} failed: {exc}", secret))
    return BatchPipelineError(redact(f"Gemini {action} failed: {type(exc).__name__}: {exc}", secret))


def _unless_gone(fn: Callable[..., Any], gone: tuple[int, ...]) -> Callable[..., Any]:
    """``fn``, answering None where the API says the resource is not there (deleted before: idempotent)."""

    def call(**kwargs: Any) -> Any:
        try:
            return fn(**kwargs)
        except genai_errors.APIError as exc:
            if exc.code in gone:
                return None
            raise

    return call


def resolve_key_env(settings: GeminiBatchSettings) -> str | None:
    """``$GEMINI_API_KEY``, or ``$GOOGLE_API_KEY`` when the default variable is unset (the SDK's own order)."""
    env = settings.api_key_env
    if env == KEY_ENV and not os.environ.get(KEY_ENV) and os.environ.get(FALLBACK_KEY_ENV):
        return FALLBACK_KEY_ENV
    return env


def input_file(work: ShardWork) -> bytes:
    """The attempt's JSONL: the shared request parts serialised once, each line adds its key and prompt."""
    shared = json.dumps(request_template(work.plan), ensure_ascii=False, separators=(",", ":"))[1:]
    dumps = json.dumps
    contents_of = contents_writer(work.plan)  # the examples, then the item's turns
    ids = work.items.column("request_id").to_pylist()
    prompts = work.items.column("user_prompt").to_pylist()
    return "".join(
        f'{{"key":{dumps(rid)},"request":{{"contents":{contents_of(prompt)},{shared}}}\n'
        for rid, prompt in zip(ids, prompts)
    ).encode("utf-8")


class GeminiBatchExecutor(QueueCapped):
    """Shard sizing: at most 10,000 requests (and 256 MiB) per batch. Gemini caps a batch only by its 2 GB
    input file and the tier's enqueued-token quota, but an expired batch returns nothing, so everything in it is
    sent again (and waits up to another 48 h). Small batches bound what one expiry costs, let the quota be shared
    by several batches in flight (throughput comes from concurrency, not size), and keep the in-memory upload
    small."""

    name = "gemini_batch"
    quota_dimensions = (Dimension.TOKENS,)
    window_hours = 48.0  # a Gemini batch expires after 48 h
    pricing = "batch"
    max_requests_per_batch = 10_000
    max_bytes_per_batch = 256 * 2**20
    settings_model = GeminiBatchSettings

    def __init__(self, settings: GeminiBatchSettings):
        self.settings = settings
        self.poll_interval_s = settings.poll_interval()
        self.parse_workers = settings.parse_workers or default_workers()
        base_url, api_key = resolve_endpoint(
            self.name, sandbox=settings.sandbox, base_url=settings.base_url, api_key_env=resolve_key_env(settings)
        )
        self._key = api_key
        options = types.HttpOptions(
            base_url=base_url, api_version=settings.api_version, timeout=int(settings.timeout_s * 1000)
        )  # the SDK's timeout is in ms
        self.client = genai.Client(api_key=api_key, http_options=options)

    # -- calls and retries ----------------------------------------------------------------------------------
    def _call(self, action: str, fn: Callable[..., Any], *args: Any, retry: bool = True, **kwargs: Any) -> Any:
        """``fn`` with our retries of transient errors (the server's requested wait honoured, capped at 60 s)."""
        attempts = self.settings.max_retries + 1 if retry else 1
        for attempt in range(attempts):
            try:
                return fn(*args, **kwargs)
            except (genai_errors.APIError, httpx2.TransportError, ValueError, KeyError) as exc:
                error = translate(exc, action, self._key)
                if not isinstance(error, TransientError) or attempt == attempts - 1:
                    raise error from None
                self._sleep(error, attempt, action)
        raise AssertionError("unreachable")

    @staticmethod
    def _sleep(error: TransientError, attempt: int, action: str) -> None:
        wait = retry_wait_s(attempt, error.retry_after_s)
        log.info("%s: %s; retrying in %.2f s", action, error, wait)
        time.sleep(wait)

    # -- submit -------------------------------------------------------------------------------------------
    def submit(self, work: ShardWork) -> BatchHandle:
        if work.items.num_rows > self.max_requests_per_batch:
            raise ConfigError(
                f"shard {work.shard_id} has {work.items.num_rows} requests; gemini_batch sends at "
                f"most {self.max_requests_per_batch} per batch (lower shards.max_requests)"
            )
        embed = is_embedding(work.plan)
        data = embed_input_file(work) if embed else input_file(work)
        if len(data) > self.max_bytes_per_batch:
            raise ConfigError(
                f"shard {work.shard_id} input is {len(data)} bytes; gemini_batch sends at most "
                f"{self.max_bytes_per_batch} per batch (lower shards.max_bytes)"
            )
        uploaded = self._call(
            "file upload",
            lambda: self.client.files.upload(
                file=io.BytesIO(data), config={"mime_type": INPUT_MIME, "display_name": work.key}
            ),
        )
        return self._create_once(work, uploaded.name, embed)

    def _create(self, model: str, file_name: str, key: str, embed: bool) -> types.BatchJob:
        """``batches.create``, or for an embeddings job ``batches.create_embeddings`` (experimental in the SDK,
        which warns on every call; its ``src`` must name the file as ``file_name``: a bare string is refused)."""
        if not embed:
            return self.client.batches.create(model=model, src=file_name, config={"display_name": key})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", genai_errors.ExperimentalWarning)
            return self.client.batches.create_embeddings(
                model=model, src={"file_name": file_name}, config={"display_name": key}
            )

    def _create_once(self, work: ShardWork, file_name: str, embed: bool = False) -> BatchHandle:
        """Create without blind retries: a create that failed in transit may have succeeded, so before each
        retry the batch is looked up by its display name (a 429 created nothing)."""
        for attempt in range(self.settings.max_retries + 1):
            try:
                job = self._create(work.plan.model, file_name, work.key, embed)
                return BatchHandle(self.name, str(job.name), work.key, file_name)
            except (genai_errors.APIError, httpx2.TransportError) as exc:
                error = translate(exc, "batch create", self._key, where=Where.CREATE, dimension=Dimension.TOKENS)
                if isinstance(error, QuotaError):  # RESOURCE_EXHAUSTED: the model's enqueued tokens are spent
                    raise error from None
                if not isinstance(error, TransientError):
                    raise error from None
                if not (isinstance(exc, genai_errors.APIError) and exc.code == 429):
                    found = self.find(work.key)
                    if found is not None:
                        log.warning(
                            "batch create for %s failed (%s) but Google has it: %s", work.key, error, found.batch_id
                        )
                        return BatchHandle(self.name, found.batch_id, work.key, file_name)
                if attempt == self.settings.max_retries:
                    raise error from None
                self._sleep(error, attempt, f"batch create for {work.key}")
        raise AssertionError("unreachable")

    # -- poll / fetch / cancel ------------------------------------------------------------------------------
    def _get(self, handle: BatchHandle) -> types.BatchJob:
        return self._call("batch get", self.client.batches.get, name=handle.batch_id)

    def poll(self, handle: BatchHandle) -> BatchStatus:
        return self._status(self._get(handle))

    def _status(self, job: types.BatchJob) -> BatchStatus:
        state = job.state
        if state is None or state in REFUSED_STATES or state not in STATE_MAP:
            raise BatchPipelineError(f"Gemini batch {job.name} has unknown state {state!r}")
        mapped = STATE_MAP[state]
        errors = self._failure(str(job.name)) if mapped == BatchState.FAILED else []
        return BatchStatus(mapped, state.value, errors=errors)  # the SDK drops batchStats: counts come from lines

    def _failure(self, name: str) -> list[str]:
        """Why a batch failed: the operation's ``error``, which the SDK's BatchJob does not map (one raw GET
        through the SDK's own authenticated transport)."""
        response = self._call("batch get", self.client._api_client.request, "get", name, {})
        error = (json.loads(response.body or "{}") or {}).get("error") or {}
        return [f"{error.get('status') or error.get('code')}: {error.get('message')}"] if error else []

    def fetch(self, handle: BatchHandle) -> Iterator[pa.Table]:
        job = self._get(handle)
        dest = job.dest
        if dest is None or not dest.file_name:
            if job.state == S.JOB_STATE_EXPIRED:
                log.warning("Gemini batch %s expired: it returns no results; every item goes again", handle.batch_id)
            return
        # a generated or an embeddings responses file: each block says which (the BatchJob does not)
        yield from parse_any_stream(self._download(dest.file_name), self.parse_workers)

    def _download(self, file_name: str) -> Iterator[bytes]:
        """The file's bytes as they arrive: ``files.download`` writes into a bounded queue on its own thread."""
        chunks: queue.Queue[Any] = queue.Queue(maxsize=_DOWNLOAD_QUEUE_CHUNKS)
        stop, done = threading.Event(), object()

        class Sink:
            def write(self, chunk: bytes) -> int:
                while not stop.is_set():
                    try:
                        chunks.put(bytes(chunk), timeout=0.2)
                        return len(chunk)
                    except queue.Full:
                        continue
                raise InterruptedError("the reader went away")

        def run() -> None:
            try:
                self.client.files.download(file=file_name, destination=Sink())
                chunks.put(done)
            except BaseException as exc:  # handed to the reader
                if not stop.is_set():
                    chunks.put(exc)

        thread = threading.Thread(target=run, name="gemini-download", daemon=True)
        thread.start()
        try:
            while (item := chunks.get()) is not done:
                if isinstance(item, BaseException):
                    raise translate(item, "file download", self._key) from None
                yield item
        finally:
            stop.set()
            thread.join(timeout=5)

    def cancel(self, handle: BatchHandle) -> None:
        try:
            self._call("batch cancel", self.client.batches.cancel, name=handle.batch_id)
        except SystemicError:
            if self.poll(handle).state.ended:  # it ended on its own meanwhile: nothing to cancel
                return
            raise

    @property
    def retention(self) -> Retention:
        return self.settings.retention

    def discard(self, handle: BatchHandle) -> list[str]:
        """Delete the uploaded input file and the result file (files otherwise stay 48 h), then the ended batch
        itself, once the results are stored. The batch goes last: it is what names the result file, so a try cut
        short is finished by the next one. Anything already gone counts as deleted."""
        # one raw GET through the SDK's transport: its BatchJob drops the input file (``inputConfig.fileName``)
        raw = self._call(
            "batch get",
            _unless_gone(lambda name: self.client._api_client.request("get", name, {}), (404,)),
            name=handle.batch_id,
        )
        operation = (json.loads(raw.body or "{}") or {}) if raw is not None else {}
        meta = operation.get("metadata") or {}
        names = [
            (meta.get("inputConfig") or {}).get("fileName") or handle.input_file_id,
            (meta.get("output") or {}).get("responsesFile"),
        ]
        gone = []
        for name in dict.fromkeys(n for n in names if n):
            # a file that is not there answers 403 ("... or it may not exist"), as the real API does
            self._call("file delete", _unless_gone(self.client.files.delete, (403, 404)), name=name)
            gone.append(name)
        if raw is None or operation.get("done"):  # an operation is done once the batch has ended
            self._call("batch delete", _unless_gone(self.client.batches.delete, (404,)), name=handle.batch_id)
            gone.append(handle.batch_id)
        return gone

    def find(
        self, key: str, request_ids: Sequence[str] | None = None, not_before: str | None = None
    ) -> BatchHandle | None:
        """By the attempt key in the batch's display name (request IDs and time are not needed here)."""
        scanned = 0
        pager = self._call("batch list", self.client.batches.list, config={"page_size": 100})
        try:
            for job in pager:  # the pager fetches the next pages as it goes
                if job.display_name == key:
                    return BatchHandle(self.name, str(job.name), key)
                scanned += 1
                if scanned >= self.settings.find_scan_limit:
                    log.warning("find(%s): no match in the newest %d batches", key, scanned)
                    break
        except (genai_errors.APIError, httpx2.TransportError) as exc:
            raise translate(exc, "batch list", self._key) from None
        return None
