"""OpenAI Batch API executor (real ``openai`` SDK): upload, create, poll, download, cancel, find.

Every provider status is mapped explicitly; an unknown one is an error. The attempt key rides in the
batch metadata, so a crash between "the provider accepted the batch" and "we recorded its ID" is
repaired by listing batches and matching the key, never by submitting again.
"""

import logging
import random
import time
from collections.abc import Iterator, Sequence
from typing import Any

import httpx2
import openai
import pyarrow as pa

from batch_pipeline.core.error_table import Family, Where
from batch_pipeline.core.errors import (
    BatchPipelineError,
    ConfigError,
    QuotaError,
    ResultsGoneError,
    SystemicError,
    TransientError,
)
from batch_pipeline.core.ledger.capacity import Dimension
from batch_pipeline.core.ledger.executor import BatchHandle, BatchState, BatchStatus, ShardWork
from batch_pipeline.executors.batch_backend import BatchBackend
from batch_pipeline.executors.endpoint import resolve_endpoint
from batch_pipeline.executors.openai.embeddings import (
    EMBEDDINGS_URL,
    embedding_request_lines,
    is_embedding,
    parse_embedding_stream,
)
from batch_pipeline.executors.openai.format import CHAT_URL, parse_output_stream, request_lines
from batch_pipeline.executors.openai.settings import OpenAIBatchSettings
from batch_pipeline.executors.provider_errors import classified, connection_error, redact, retry_after_s
from batch_pipeline.executors.tls import shared_tls_context

log = logging.getLogger(__name__)

KEY_METADATA = "batch_pipeline_key"
RETENTION_DAYS = 30  # output and error files are deleted this long after the batch completed
STATUS_MAP = {
    "validating": BatchState.VALIDATING,
    "in_progress": BatchState.RUNNING,
    "finalizing": BatchState.FINALIZING,
    "completed": BatchState.COMPLETED,
    "expired": BatchState.EXPIRED,
    "cancelling": BatchState.CANCELLING,
    "cancelled": BatchState.CANCELLED,
    "failed": BatchState.FAILED,
}


def translate(
    exc: Exception,
    action: str,
    secret: str | None = None,
    provider: str = "OpenAI",
    *,
    family: Family = Family.OPENAI,
    where: Where = Where.CALL,
    dimension: Dimension | None = None,
) -> BatchPipelineError:
    """SDK exception -> our error class (after the SDK's own retries were spent), by the one error table; secrets
    redacted. ``where=CREATE`` (with the ``dimension`` it fills) for the batch create."""
    if isinstance(exc, openai.APIStatusError):
        body = exc.body if isinstance(exc.body, dict) else {}
        inner = body.get("error") if isinstance(body.get("error"), dict) else {}
        code, kind = body.get("code") or inner.get("code"), body.get("type") or inner.get("type")
        code = str(code) if code is not None else None
        headers = exc.response.headers if exc.response is not None else None
        detail = body.get("message") or inner.get("message") or exc.message
        return classified(
            family,
            provider,
            action,
            exc.status_code,
            code,
            str(detail),
            reason=kind,
            retry_after=retry_after_s(headers),
            where=where,
            dimension=dimension,
            secret=secret,
        )
    if isinstance(exc, openai.APIConnectionError | openai.APITimeoutError):
        return connection_error(family, provider, action, exc, where=where, dimension=dimension, secret=secret)
    return BatchPipelineError(redact(f"{provider} {action} failed: {exc}", secret))


class OpenAIBatchExecutor(BatchBackend):
    """Subclasses (Azure) override ``_make_client`` and ``_request_lines`` and state their own ``chat_url`` (and
    ``embeddings_url``: None where embeddings jobs are not offered)."""

    name = "openai_batch"
    quota_dimensions = (Dimension.TOKENS, Dimension.PER_HOUR)
    retention_days = RETENTION_DAYS
    retention_from = "completed"
    provider = "OpenAI"
    chat_url = CHAT_URL
    embeddings_url: str | None = EMBEDDINGS_URL
    pricing = "batch"
    max_requests_per_batch = 50_000
    max_bytes_per_batch = 200 * 2**20
    settings_model = OpenAIBatchSettings

    def __init__(self, settings: OpenAIBatchSettings):
        super().__init__(settings)
        self.client, self.secret = self._make_client(settings)

    def _make_client(self, settings: OpenAIBatchSettings) -> tuple[openai.OpenAI, str | None]:
        """The SDK client and the secret it sends (redacted from every message)."""
        base_url, api_key = resolve_endpoint(
            self.name,
            sandbox=settings.sandbox,
            base_url=settings.base_url,
            api_key_env=settings.api_key_env,
            sandbox_path="/v1",
        )
        client = openai.OpenAI(
            api_key=api_key,
            base_url=base_url,
            max_retries=settings.max_retries,
            timeout=settings.timeout_s,
            http_client=openai.DefaultHttpxClient(verify=shared_tls_context()),
        )
        return client, api_key

    def _request_lines(self, work: ShardWork) -> bytes:
        return request_lines(work)

    family = Family.OPENAI

    def _translate(
        self, exc: Exception, action: str, where: Where = Where.CALL, dimension: Dimension | None = None
    ) -> BatchPipelineError:
        return translate(exc, action, self.secret, self.provider, family=self.family, where=where, dimension=dimension)

    def _call(self, action: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except openai.OpenAIError as exc:
            raise self._translate(exc, action) from None

    def submit(self, work: ShardWork) -> BatchHandle:
        if work.items.num_rows > self.max_requests_per_batch:
            raise ConfigError(
                f"shard {work.shard_id} has {work.items.num_rows} requests; {self.provider} allows "
                f"{self.max_requests_per_batch} per batch (lower shards.max_requests)"
            )
        endpoint = self.chat_url
        if is_embedding(work.plan):
            if self.embeddings_url is None:
                raise ConfigError(f"backend {self.name} does not run embeddings jobs (output.embedding)")
            endpoint = self.embeddings_url
            data = embedding_request_lines(work, self.embeddings_url)
        else:
            data = self._request_lines(work)
        if len(data) > self.max_bytes_per_batch:
            raise ConfigError(
                f"shard {work.shard_id} input is {len(data)} bytes; {self.provider} allows "
                f"{self.max_bytes_per_batch} (lower shards.max_bytes)"
            )
        name = work.key.replace(":", "_") + ".jsonl"
        uploaded = self._call("file upload", self.client.files.create, file=(name, data), purpose="batch")
        return self._create_once(work, uploaded.id, endpoint)

    def _create_once(self, work: ShardWork, file_id: str, endpoint: str | None = None) -> BatchHandle:
        """Create the batch without blind retries: a create that failed in transit may still have
        succeeded at the provider, so before each retry we look for the batch by its key."""
        create = self.client.with_options(max_retries=0).batches.create
        metadata = {KEY_METADATA: work.key, "job": work.job, "shard": work.shard_id, "attempt": str(work.attempt)}
        delay = 0.5
        for attempt in range(self.settings.max_retries + 1):
            try:
                batch = create(
                    input_file_id=file_id,
                    endpoint=endpoint or self.chat_url,
                    completion_window=self.settings.completion_window,
                    metadata=metadata,
                )
                return BatchHandle(self.name, batch.id, work.key, file_id)
            except openai.OpenAIError as error:
                exc = self._translate(error, "batch create", Where.CREATE, Dimension.PER_HOUR)
                if isinstance(exc, QuotaError):  # the account's creates per hour are spent: nothing was created
                    raise exc from None
                if not isinstance(exc, TransientError):
                    raise exc from None
                if not isinstance(error, openai.RateLimitError):  # a 429 created nothing; anything else may have
                    found = self.find(work.key)
                    if found is not None:
                        log.warning(
                            "batch create for %s failed (%s) but the provider has it: %s", work.key, exc, found.batch_id
                        )
                        return BatchHandle(self.name, found.batch_id, work.key, file_id)
                if attempt == self.settings.max_retries:
                    raise exc from None
                wait = min(exc.retry_after_s or delay * (1 + random.random()), 60.0)
                log.warning("batch create for %s failed (%s); retrying in %.2fs", work.key, exc, wait)
                time.sleep(wait)
                delay *= 2
        raise AssertionError("unreachable")

    def poll(self, handle: BatchHandle) -> BatchStatus:
        batch = self._call("batch retrieve", self.client.batches.retrieve, handle.batch_id)
        return self._status(batch)

    def _status(self, batch: Any) -> BatchStatus:
        try:
            state = STATUS_MAP[batch.status]
        except KeyError:
            raise BatchPipelineError(f"{self.provider} batch {batch.id} has unknown status {batch.status!r}") from None
        counts = batch.request_counts
        errors, codes = [], []
        if batch.errors is not None and batch.errors.data:
            errors = [
                f"line {e.line}: {e.code}: {e.message}" if e.line is not None else f"{e.code}: {e.message}"
                for e in batch.errors.data
            ]
            codes = [str(e.code) for e in batch.errors.data if e.code]
        return BatchStatus(
            state,
            batch.status,
            counts.total if counts else 0,
            counts.completed if counts else 0,
            counts.failed if counts else 0,
            errors,
            codes,
        )

    def fetch(self, handle: BatchHandle) -> Iterator[pa.Table]:
        batch = self._call("batch retrieve", self.client.batches.retrieve, handle.batch_id)
        parse = parse_embedding_stream if batch.endpoint == self.embeddings_url else parse_output_stream
        for file_id in (batch.output_file_id, batch.error_file_id):
            if not file_id:
                continue
            try:
                with self._call("file download", self.client.files.with_streaming_response.content, file_id) as resp:
                    size = resp.headers.get("content-length")  # known: blocks cut so every parse worker has one
                    yield from parse(
                        self._download(resp, file_id),
                        self.parse_workers,
                        total_bytes=int(size) if size and size.isdigit() else None,
                    )
            except (openai.NotFoundError, SystemicError) as exc:  # the file of an ended batch is gone
                if isinstance(exc, SystemicError) and "HTTP 404" not in str(exc):
                    raise
                raise ResultsGoneError(
                    f"{self.provider} has no file {file_id} of batch {handle.batch_id} any more "
                    f"(output files are deleted {RETENTION_DAYS} days after the batch completed)"
                ) from None

    def _download(self, resp: Any, file_id: str) -> Iterator[bytes]:
        """The file's bytes; a connection that breaks mid-download is a TransientError (the runner fetches again)."""
        try:
            yield from resp.iter_bytes(1 << 20)
        except openai.OpenAIError as exc:
            raise self._translate(exc, "file download") from None
        except httpx2.TransportError as exc:
            raise TransientError(
                redact(f"{self.provider} file download of {file_id} failed: {type(exc).__name__}: {exc}", self.secret)
            ) from None

    def cancel(self, handle: BatchHandle) -> None:
        self._call("batch cancel", self.client.batches.cancel, handle.batch_id)

    def discard(self, handle: BatchHandle) -> list[str]:
        """Delete the batch's input, output and error files once its results are stored (files stay until
        deleted; the batch object itself cannot be). A file already gone counts as deleted."""
        batch = self._call("batch retrieve", self.client.batches.retrieve, handle.batch_id)
        files = (batch.input_file_id or handle.input_file_id, batch.output_file_id, batch.error_file_id)
        gone = []
        for file_id in dict.fromkeys(f for f in files if f):
            try:
                self.client.files.delete(file_id)
            except openai.NotFoundError:
                pass  # deleted before (an earlier try that did not get to record it)
            except openai.OpenAIError as exc:
                raise self._translate(exc, f"file delete of {file_id}") from None
            gone.append(file_id)
        return gone

    def find(
        self, key: str, request_ids: Sequence[str] | None = None, not_before: str | None = None
    ) -> BatchHandle | None:
        """By the attempt key in the batch metadata (request IDs and time are not needed here)."""
        scanned = 0
        page = self._call("batch list", self.client.batches.list, limit=100)
        for batch in page:  # the SDK's auto-pagination walks newest first
            if (batch.metadata or {}).get(KEY_METADATA) == key:
                return BatchHandle(self.name, batch.id, key, batch.input_file_id)
            scanned += 1
            if scanned >= self.settings.find_scan_limit:
                log.warning("find(%s): no match in the newest %d batches", key, scanned)
                break
        return None
