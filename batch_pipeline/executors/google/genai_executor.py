"""What the Gemini API and Vertex AI batch executors share: both drive ``client.batches`` of ``google-genai``.

- Retries are ours, not the SDK's: its retry policy ignores the server's requested wait (``google.rpc.RetryInfo``),
  so each client is built with one attempt per call and ``_call`` retries transient errors, honouring that wait.
- A create is never retried blind (``_create_once``): one that failed in transit may have created the batch, so
  before each retry the batch is looked up by its display name, the attempt key (a 429 created nothing).
- ``find`` scans the newest batches for that display name (``_named``), up to ``find_scan_limit``.
- Every ``JobState`` the SDK can return is mapped (``STATE_MAP``); an unknown one is an error.
"""

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

from google.genai import errors as genai_errors
from google.genai import types

from batch_pipeline.core.error_table import Family, Where
from batch_pipeline.core.errors import BatchPipelineError, QuotaError, SystemicError, TransientError
from batch_pipeline.core.ledger.capacity import Dimension
from batch_pipeline.core.ledger.executor import BatchHandle, BatchState, BatchStatus
from batch_pipeline.executors.batch_backend import BatchBackend
from batch_pipeline.executors.google.sdk_errors import SDK_ERRORS, translate_sdk_error
from batch_pipeline.executors.provider_errors import retry_wait_s
from batch_pipeline.executors.tls import shared_tls_context

log = logging.getLogger(__name__)


def shared_tls_args() -> dict[str, Any]:
    """``HttpOptions`` arguments that give a google-genai client the process's TLS context (``executors.tls``): its
    sync httpx client takes it as ``verify``, its async and websocket clients (never used here) as ``ssl``; else the
    client builds three of its own."""
    ctx = shared_tls_context()
    return {"client_args": {"verify": ctx}, "async_client_args": {"ssl": ctx}}


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


class GenaiBatchExecutor(BatchBackend):
    """The calls, retries, create-once, find, cancel and state mapping of a ``google-genai`` batch backend.

    A subclass sets ``family`` and ``provider`` (the error table's and the messages'), ``client`` and
    ``_secret`` (redacted from messages), and says how it creates (``submit``) and reads results (``fetch``)."""

    name: ClassVar[str]
    family: ClassVar[Family]
    provider: ClassVar[str]
    batch_noun: ClassVar[str] = "batch"  # what the provider calls one ("batch job" on Vertex), for the messages
    client: Any
    _secret: str | None

    def _translate(self, exc: Exception, action: str, **where: Any) -> BatchPipelineError:
        return translate_sdk_error(exc, self.family, self.provider, action, self._secret, **where)

    def _call(self, action: str, fn: Callable[..., Any], *args: Any, retry: bool = True, **kwargs: Any) -> Any:
        """``fn`` with our retries of transient errors (the server's requested wait honoured, capped at 60 s)."""
        attempts = self.settings.max_retries + 1 if retry else 1
        for attempt in range(attempts):
            try:
                return fn(*args, **kwargs)
            except self._retried_errors() as exc:
                error = self._translate(exc, action)
                if not isinstance(error, TransientError) or attempt == attempts - 1:
                    raise error from None
                self._sleep(error, attempt, action)
        raise AssertionError("unreachable")

    def _retried_errors(self) -> tuple[type[Exception], ...]:
        """What ``_call`` translates (and retries when transient): the SDK's errors, plus a backend's own."""
        return SDK_ERRORS

    @staticmethod
    def _sleep(error: TransientError, attempt: int, action: str) -> None:
        """Wait what the server asked, else back off; a stated wait of 0 s is no ask (backing off spares a
        server that is already refusing us)."""
        wait = retry_wait_s(attempt, error.retry_after_s or None)
        log.info("%s: %s; retrying in %.2f s", action, error, wait)
        time.sleep(wait)

    def _create_once(
        self, key: str, create: Callable[[], types.BatchJob], dimension: Dimension, input_file_id: str | None
    ) -> BatchHandle:
        """``create()`` without blind retries: before each retry the batch is looked up by its display name (the
        attempt key), and one found is the batch (``input_file_id`` filled in when the listing does not say it)."""
        action = f"{self.batch_noun} create"
        for attempt in range(self.settings.max_retries + 1):
            try:
                job = create()
                return BatchHandle(self.name, str(job.name), key, input_file_id)
            except SDK_ERRORS as exc:
                error = self._translate(exc, action, where=Where.CREATE, dimension=dimension)
                if isinstance(error, QuotaError):  # RESOURCE_EXHAUSTED: the account's queue is full
                    raise error from None
                if not isinstance(error, TransientError):
                    raise error from None
                if not (isinstance(exc, genai_errors.APIError) and exc.code == 429):  # a 429 created nothing
                    found = self.find(key)
                    if found is not None:
                        log.warning(
                            "%s for %s failed (%s) but %s has it: %s", action, key, error, self.provider, found.batch_id
                        )
                        return found if found.input_file_id else dataclasses.replace(found, input_file_id=input_file_id)
                if attempt == self.settings.max_retries:
                    raise error from None
                self._sleep(error, attempt, f"{action} for {key}")
        raise AssertionError("unreachable")

    def find(
        self, key: str, request_ids: Sequence[str] | None = None, not_before: str | None = None
    ) -> BatchHandle | None:
        raise NotImplementedError

    def _named(self, key: str, config: Any) -> Iterator[types.BatchJob]:
        """The listed batches whose display name is ``key``, newest first, among at most ``find_scan_limit``."""
        action = f"{self.batch_noun} list"
        pager = self._call(action, self.client.batches.list, config=config)
        scanned = 0
        try:
            for job in pager:  # the pager fetches the next pages as it goes
                scanned += 1
                if job.display_name == key:
                    yield job
                if scanned >= self.settings.find_scan_limit:
                    log.warning("find(%s): stopped after the newest %d batches", key, scanned)
                    return
        except SDK_ERRORS as exc:
            raise self._translate(exc, action) from None

    def _state(self, job: types.BatchJob) -> BatchState:
        """The job's state as ours; an unknown (or unset) one is an error."""
        state = job.state
        if state is None or state in REFUSED_STATES or state not in STATE_MAP:
            raise BatchPipelineError(f"{self.provider} {self.batch_noun} {job.name} has unknown state {state!r}")
        return STATE_MAP[state]

    def _get(self, handle: BatchHandle) -> types.BatchJob:
        return self._call(f"{self.batch_noun} get", self.client.batches.get, name=handle.batch_id)

    def poll(self, handle: BatchHandle) -> BatchStatus:
        return self._status(self._get(handle))

    def _status(self, job: types.BatchJob) -> BatchStatus:
        """What a poll reports of ``job`` (its state by ``_state``, and what the provider says beside it)."""
        raise NotImplementedError

    def cancel(self, handle: BatchHandle) -> None:
        try:
            self._call(f"{self.batch_noun} cancel", self.client.batches.cancel, name=handle.batch_id)
        except SystemicError:
            if self.poll(handle).state.ended:  # it ended on its own meanwhile: nothing to cancel
                return
            raise
