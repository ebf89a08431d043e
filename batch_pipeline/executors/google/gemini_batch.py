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

Calls, retries, the create-once, find's scan and the state map are the ones Vertex AI's executor has too
(``genai_executor.py``, ``sdk_errors.py``).
"""

import io
import json
import logging
import os
import queue
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import google.genai as genai
import pyarrow as pa
from google.genai import errors as genai_errors
from google.genai import types

from batch_pipeline.core.error_table import Family
from batch_pipeline.core.errors import BatchPipelineError, ConfigError, TransientError
from batch_pipeline.core.ledger.capacity import Dimension
from batch_pipeline.core.ledger.executor import BatchHandle, BatchState, BatchStatus, ShardWork
from batch_pipeline.executors.endpoint import resolve_endpoint
from batch_pipeline.executors.google.embed_format import embed_input_file, parse_any_stream
from batch_pipeline.executors.google.format import contents_writer, request_template
from batch_pipeline.executors.google.genai_executor import (
    REFUSED_STATES,
    STATE_MAP,
    GenaiBatchExecutor,
    shared_tls_args,
)
from batch_pipeline.executors.google.sdk_errors import SDK_ERRORS
from batch_pipeline.executors.google.settings import FALLBACK_KEY_ENV, KEY_ENV, GeminiBatchSettings
from batch_pipeline.executors.openai.embeddings import is_embedding
from batch_pipeline.executors.provider_errors import redact

log = logging.getLogger(__name__)

INPUT_MIME = "jsonl"  # what the batch-mode docs upload with
_DOWNLOAD_QUEUE_CHUNKS = 16  # 1 MiB chunks held between the download thread and the parser
S = types.JobState
__all__ = ["REFUSED_STATES", "STATE_MAP", "GeminiBatchExecutor", "GeminiBatchSettings", "input_file"]


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


class GeminiBatchExecutor(GenaiBatchExecutor):
    """Shard sizing: at most 10,000 requests (and 256 MiB) per batch. Gemini caps a batch only by its 2 GB
    input file and the tier's enqueued-token quota, but an expired batch returns nothing, so everything in it is
    sent again (and waits up to another 48 h). Small batches bound what one expiry costs, let the quota be shared
    by several batches in flight (throughput comes from concurrency, not size), and keep the in-memory upload
    small."""

    name = "gemini_batch"
    family = Family.GEMINI
    provider = "Gemini"
    quota_dimensions = (Dimension.TOKENS,)
    window_hours = 48.0  # a Gemini batch expires after 48 h
    pricing = "batch"
    max_requests_per_batch = 10_000
    max_bytes_per_batch = 256 * 2**20
    settings_model = GeminiBatchSettings

    def __init__(self, settings: GeminiBatchSettings):
        super().__init__(settings)
        base_url, api_key = resolve_endpoint(
            self.name, sandbox=settings.sandbox, base_url=settings.base_url, api_key_env=resolve_key_env(settings)
        )
        self._secret = api_key
        options = types.HttpOptions(
            base_url=base_url,
            api_version=settings.api_version,
            timeout=int(settings.timeout_s * 1000),  # in ms
            **shared_tls_args(),
        )
        self.client = genai.Client(api_key=api_key, http_options=options)

    @property
    def _key(self) -> str | None:
        """The API key (redacted from every message)."""
        return self._secret

    def _translate(self, exc: Exception, action: str, **where: Any) -> BatchPipelineError:
        """As for Vertex (``sdk_errors``), but an upload session that broke in the SDK's hands (a ValueError or
        KeyError while uploading) is transient: the upload starts over."""
        if isinstance(exc, ValueError | KeyError) and action == "file upload":
            return TransientError(redact(f"Gemini {action} failed: {exc}", self._secret))
        return super()._translate(exc, action, **where)

    def _retried_errors(self) -> tuple[type[Exception], ...]:
        return (*SDK_ERRORS, ValueError, KeyError)  # the upload session's own breakages (``translate``)

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
        return self._create_once(
            work.key,
            lambda: self._create(work.plan.model, uploaded.name, work.key, embed),
            Dimension.TOKENS,  # RESOURCE_EXHAUSTED: the model's enqueued tokens are spent
            uploaded.name,
        )

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

    # -- poll / fetch / cancel ------------------------------------------------------------------------------
    def _status(self, job: types.BatchJob) -> BatchStatus:
        mapped = self._state(job)
        errors = self._failure(str(job.name)) if mapped == BatchState.FAILED else []
        # the SDK drops batchStats: the counts come from the lines
        return BatchStatus(mapped, job.state.value, errors=errors)  # type: ignore[union-attr]

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
                    raise self._translate(item, "file download") from None
                yield item
        finally:
            stop.set()
            thread.join(timeout=5)

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
        job = next(self._named(key, {"page_size": 100}), None)
        return BatchHandle(self.name, str(job.name), key) if job is not None else None
