"""Anthropic Message Batches executor (real ``anthropic`` SDK): create, poll, stream results, cancel, find.

Every ``processing_status`` is mapped explicitly; an unknown one is an error.

Re-attaching (``find``). An Anthropic batch carries no metadata, and neither the batch object nor the list
API returns its requests; a request's custom_id is our 64-character request_id, so the attempt key cannot ride
along either. What the API does expose is each batch's ``created_at``, its request total (the sum of
``request_counts``) and, once it has ended, the custom_ids of its results. ``find(key, request_ids=...,
not_before=...)`` therefore matches on those, with the request IDs and the intent time of the attempt (both
in the runner's intent record):

1. list batches newest first (at most ``find_scan_limit``), stopping at ``not_before - find_clock_skew_s``;
2. keep those whose total equals ``len(request_ids)``; batches created at or after ``not_before`` are tried
   first, then those within the clock-skew margin;
3. an ended candidate matches when its results hold exactly our custom_ids (verified); otherwise a single
   candidate that has not ended yet is taken (unverified), and several are ambiguous: ``TransientError``,
   so the caller retries once they have ended and can be told apart. Nothing is resubmitted on a guess.

Without ``request_ids`` (the protocol's plain ``find(key)``) nothing can be matched: None, with a warning. The
runner always passes the attempt's request IDs and intent time.

Residual risk: an unverified match may be another batch of the same size created in the same window (another
job in the workspace); its results are then ignored by ID at ingestion and the attempt's items stay pending,
so nothing is lost or double counted, but the real batch is paid for and its results are not collected.

``submit`` sends the create call without SDK retries: after a 5xx or a lost connection it first asks ``find``
whether the batch exists (a failed create may still have created one), and only then tries again.
"""

import logging
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import anthropic
import httpx2
import pyarrow as pa
import pyarrow.json as pajson

from batch_pipeline.core.error_table import Family, Where
from batch_pipeline.core.errors import BatchPipelineError, ConfigError, QuotaError, ResultsGoneError, TransientError
from batch_pipeline.core.ledger.capacity import Dimension
from batch_pipeline.core.ledger.executor import BatchHandle, BatchState, BatchStatus, ShardWork
from batch_pipeline.core.run.threads import ordered_map
from batch_pipeline.executors.anthropic.format import parse_results_block
from batch_pipeline.executors.anthropic.request_format import batch_requests
from batch_pipeline.executors.anthropic.settings import AnthropicBatchSettings
from batch_pipeline.executors.batch_backend import BatchBackend
from batch_pipeline.executors.endpoint import resolve_endpoint
from batch_pipeline.executors.jsonl_blocks import iter_blocks
from batch_pipeline.executors.provider_errors import classified, connection_error, redact, retry_after_s, retry_wait_s
from batch_pipeline.executors.tls import shared_tls_context

log = logging.getLogger(__name__)

MAX_REQUESTS = 100_000
MAX_BYTES = 256 * 2**20
STATUS_MAP = {"in_progress": BatchState.RUNNING, "canceling": BatchState.CANCELLING, "ended": BatchState.COMPLETED}


RETENTION_DAYS = 29  # results are deleted this long after the batch was created


def translate(
    exc: Exception,
    action: str,
    secret: str | None = None,
    *,
    where: Where = Where.CALL,
    dimension: Dimension | None = None,
) -> BatchPipelineError:
    """SDK exception -> our error class (after the SDK's own retries were spent), by the one error table; secrets
    redacted. ``where=CREATE`` (with the ``dimension`` it fills) for the batch create."""
    if isinstance(exc, anthropic.APIStatusError):
        kind = exc.type or "error"
        detail = exc.api_message or str(exc.message)
        return classified(
            Family.ANTHROPIC,
            "Anthropic",
            action,
            exc.status_code,
            kind,
            detail,
            reason=exc.error_code,
            retry_after=retry_after_s(getattr(exc.response, "headers", None)),
            where=where,
            dimension=dimension,
            secret=secret,
        )
    if isinstance(exc, anthropic.APIConnectionError):
        return connection_error(
            Family.ANTHROPIC, "Anthropic", action, exc, where=where, dimension=dimension, secret=secret
        )
    return BatchPipelineError(redact(f"Anthropic {action} failed: {exc}", secret))


def _as_datetime(value: datetime | str) -> datetime:
    moment = datetime.fromisoformat(value) if isinstance(value, str) else value
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


class AnthropicBatchExecutor(BatchBackend):
    name = "anthropic_batch"
    quota_dimensions = (Dimension.REQUESTS,)
    retention_days = RETENTION_DAYS
    retention_from = "was created"
    pricing = "batch"
    max_requests_per_batch = MAX_REQUESTS
    max_bytes_per_batch = MAX_BYTES
    settings_model = AnthropicBatchSettings

    def __init__(self, settings: AnthropicBatchSettings):
        super().__init__(settings)
        base_url, api_key = resolve_endpoint(
            self.name, sandbox=settings.sandbox, base_url=settings.base_url, api_key_env=settings.api_key_env
        )
        self.client = anthropic.Anthropic(
            api_key=api_key,
            base_url=base_url,
            max_retries=settings.max_retries,
            timeout=settings.timeout_s,
            http_client=anthropic.DefaultHttpxClient(verify=shared_tls_context()),
        )
        self._create_client = self.client.with_options(max_retries=0)

    def _call(self, action: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except anthropic.AnthropicError as exc:
            raise translate(exc, action, self.client.api_key) from None

    # -- submit -------------------------------------------------------------------------------------------
    def submit(self, work: ShardWork) -> BatchHandle:
        if work.items.num_rows > self.max_requests_per_batch:
            raise ConfigError(
                f"shard {work.shard_id} has {work.items.num_rows} requests; Anthropic allows "
                f"{self.max_requests_per_batch} per batch (lower shards.max_requests)"
            )
        requests, size = batch_requests(work)
        if size > self.max_bytes_per_batch:
            raise ConfigError(
                f"shard {work.shard_id} request body is about {size} bytes; Anthropic allows "
                f"{self.max_bytes_per_batch} (lower shards.max_bytes)"
            )
        started = datetime.now(UTC)
        for attempt in range(self.settings.max_retries + 1):
            try:
                batch = self._create_client.messages.batches.create(requests=requests)  # type: ignore[arg-type]
                return BatchHandle(self.name, batch.id, work.key)
            except anthropic.AnthropicError as exc:
                error = translate(
                    exc, "batch create", self.client.api_key, where=Where.CREATE, dimension=Dimension.REQUESTS
                )
                if isinstance(error, QuotaError):  # the account's processing queue is full: nothing was created
                    raise error from None
                if not isinstance(error, TransientError) or attempt == self.settings.max_retries:
                    raise error from None
                if not isinstance(exc, anthropic.RateLimitError):  # the create may have happened anyway
                    found = self.find(work.key, request_ids=work.request_ids, not_before=started)
                    if found is not None:
                        log.warning(
                            "batch create for %s failed (%s) but the batch exists as %s; using it",
                            work.key,
                            error,
                            found.batch_id,
                        )
                        return found
                wait = retry_wait_s(attempt, error.retry_after_s or None)
                log.info("batch create for %s: %s; retrying in %.2f s", work.key, error, wait)
                time.sleep(wait)
        raise AssertionError("unreachable")

    # -- poll / fetch / cancel ----------------------------------------------------------------------------------
    def poll(self, handle: BatchHandle) -> BatchStatus:
        batch = self._call("batch retrieve", self.client.messages.batches.retrieve, handle.batch_id)
        return self._status(batch)

    def _status(self, batch: Any) -> BatchStatus:
        try:
            state = STATUS_MAP[batch.processing_status]
        except KeyError:
            raise BatchPipelineError(
                f"Anthropic batch {batch.id} has unknown processing_status {batch.processing_status!r}"
            ) from None
        counts = batch.request_counts
        if state == BatchState.COMPLETED and counts.canceled > 0:
            state = BatchState.CANCELLED
        elif state == BatchState.COMPLETED and counts.expired > 0:
            state = BatchState.EXPIRED
        total = counts.processing + counts.succeeded + counts.errored + counts.canceled + counts.expired
        return BatchStatus(
            state, batch.processing_status, total, counts.succeeded, counts.errored + counts.canceled + counts.expired
        )

    def _stream_results(self, batch_id: str) -> Iterator[bytes]:
        """The results JSONL of an ended batch, in blocks that end at line boundaries."""
        try:
            with self.client.messages.batches.with_streaming_response.results(batch_id) as resp:
                yield from iter_blocks(resp.iter_bytes(1 << 20))
        except anthropic.NotFoundError:  # the results of an ended batch are kept 29 days after its creation
            raise ResultsGoneError(
                f"Anthropic has no results for batch {batch_id} any more (they are deleted "
                f"{RETENTION_DAYS} days after the batch was created)"
            ) from None
        except anthropic.AnthropicError as exc:
            raise translate(exc, "batch results", self.client.api_key) from None
        except httpx2.TransportError as exc:  # the connection broke while streaming
            raise TransientError(
                redact(f"Anthropic batch results failed: {type(exc).__name__}: {exc}", self.client.api_key)
            ) from None

    def fetch(self, handle: BatchHandle) -> Iterator[pa.Table]:
        # blocks parsed on worker threads, in file order, while the next ones download
        yield from ordered_map(parse_results_block, self._stream_results(handle.batch_id), self.parse_workers)

    def cancel(self, handle: BatchHandle) -> None:
        try:
            self.client.messages.batches.cancel(handle.batch_id)
        except anthropic.BadRequestError as exc:
            if self.poll(handle).state.ended:  # it ended on its own meanwhile: nothing to cancel
                return
            raise translate(exc, "batch cancel", self.client.api_key) from None
        except anthropic.AnthropicError as exc:
            raise translate(exc, "batch cancel", self.client.api_key) from None

    def discard(self, handle: BatchHandle) -> list[str]:
        """Delete the ended batch and its results (``messages.batches.delete``) once they are stored; a batch
        already gone counts as deleted."""
        try:
            self.client.messages.batches.delete(handle.batch_id)
        except anthropic.NotFoundError:
            pass  # deleted before (an earlier try that did not get to record it)
        except anthropic.AnthropicError as exc:
            raise translate(exc, "batch delete", self.client.api_key) from None
        return [handle.batch_id]

    # -- find ---------------------------------------------------------------------------------------------
    def _result_ids(self, batch_id: str) -> set[str]:
        """The custom_ids in an ended batch's results."""
        ids: set[str] = set()
        schema = pa.schema([("custom_id", pa.string())])
        options = pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
        for block in self._stream_results(batch_id):
            try:
                column = pajson.read_json(pa.BufferReader(block), parse_options=options).column("custom_id")
            except pa.ArrowInvalid:  # an odd line: the tolerant parser
                column = parse_results_block(block).column("request_id")
            ids.update(column.to_pylist())
        return ids

    def find(
        self, key: str, request_ids: Sequence[str] | None = None, not_before: datetime | str | None = None
    ) -> BatchHandle | None:
        """The batch this attempt created, if any (see the module docstring for how it is matched)."""
        if request_ids is None:
            log.warning(
                "find(%s): Anthropic batches carry no key; without the attempt's request IDs no batch can be matched",
                key,
            )
            return None
        wanted = set(request_ids)
        since = _as_datetime(not_before) if not_before is not None else None
        floor = since - timedelta(seconds=self.settings.find_clock_skew_s) if since is not None else None
        strict: list[Any] = []
        margin: list[Any] = []
        scanned = 0
        for batch in self._call("batch list", self.client.messages.batches.list, limit=100):  # newest first
            created = _as_datetime(batch.created_at)
            if floor is not None and created < floor:
                break
            scanned += 1
            if scanned > self.settings.find_scan_limit:
                log.warning("find(%s): stopped after %d batches", key, self.settings.find_scan_limit)
                break
            if self._status(batch).total == len(wanted):
                (strict if since is None or created >= since else margin).append(batch)
        for group in (strict, margin):
            found = self._match(key, group, wanted)
            if found is not None:
                return found
        return None

    def _match(self, key: str, candidates: list[Any], wanted: set[str]) -> BatchHandle | None:
        open_ones = []
        for batch in candidates:
            if batch.processing_status != "ended":
                open_ones.append(batch)
            elif batch.results_url and self._result_ids(batch.id) == wanted:
                return BatchHandle(self.name, batch.id, key)
        if len(open_ones) == 1:
            log.warning(
                "find(%s): re-attaching to %s, the only unfinished batch of the right size and time; it "
                "cannot be verified before it ends",
                key,
                open_ones[0].id,
            )
            return BatchHandle(self.name, open_ones[0].id, key)
        if open_ones:
            raise TransientError(
                f"find({key}): {len(open_ones)} unfinished batches match by size and time "
                f"({', '.join(b.id for b in open_ones)}); retry once they have ended"
            )
        return None
