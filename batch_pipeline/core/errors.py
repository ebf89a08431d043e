"""The error hierarchy: every failure says whether retrying can help.

- ``TransientError``: retry with backoff (429, 5xx, timeouts, an expired or preempted batch).
- ``PoisonItemError``: this one item will never succeed as sent (context too long, malformed); it is
  retried up to the per-item budget and then dead-lettered.
- ``SystemicError``: nothing will succeed until a human fixes something (bad key, unknown model, no credit);
  the job stops once, and no item's budget is spent on it.
- ``QuotaError`` (a ``TransientError``): the account's queue is full; the shard waits for room.

Which class a provider's answer is decides one table, ``core/error_table.py``; ``provider_error`` builds the
exception for its decision and ``classify_line_error`` asks it about a batch's failed line.
"""

from enum import StrEnum

from batch_pipeline.core.error_table import Decision, Family, Kind, Where, decide, quota_codes, stop_codes


class ErrorClass(StrEnum):
    TRANSIENT = "transient"
    POISON = "poison"
    SYSTEMIC = "systemic"
    INVALID_OUTPUT = "invalid_output"


class BatchPipelineError(Exception):
    """Base of every error this package raises on purpose."""

    error_class: ErrorClass | None = None
    retryable: bool = False


class ConfigError(BatchPipelineError):
    """A job spec, price table or setting is wrong; the message names the file and field."""


class InputError(BatchPipelineError):
    """Input files cannot be read at all (a bad row is not an InputError: it goes to rejects)."""


class TransientError(BatchPipelineError):
    error_class = ErrorClass.TRANSIENT
    retryable = True

    def __init__(self, message: str, *, code: str | None = None, retry_after_s: float | None = None):
        super().__init__(message)
        self.code = code
        self.retry_after_s = retry_after_s


class QuotaError(TransientError):
    """The provider said "not now": the account's queue is full (enqueued tokens or requests, open jobs, creates
    per hour). Never a job stop and never an item's retry: the attempt is recorded (nothing billed), the limit is
    learned (``limit``: what the provider stated, if it did) and the shard waits for room."""

    def __init__(
        self,
        message: str,
        *,
        dimension: str,
        limit: int | None = None,
        code: str | None = None,
        retry_after_s: float | None = None,
    ):
        super().__init__(message, code=code, retry_after_s=retry_after_s)
        self.dimension = dimension  # a core.ledger.capacity.Dimension value
        self.limit = limit


class PoisonItemError(BatchPipelineError):
    error_class = ErrorClass.POISON
    retryable = False


class SystemicError(BatchPipelineError):
    """Stops the job; resuming after the cause is fixed continues where it stopped."""

    error_class = ErrorClass.SYSTEMIC
    retryable = False

    def __init__(self, message: str, *, code: str | None = None):
        super().__init__(message)
        self.code = code


class ResultsGoneError(BatchPipelineError):
    """The provider no longer has an ended batch's results (deleted after its retention, e.g. OpenAI 30 days after
    completion, Anthropic 29 days after creation): what they held was billed and cannot be fetched again."""


class ReconciliationError(BatchPipelineError):
    """expected != valid + invalid + missing + dead_lettered: something was lost or double counted."""


class StaleAttemptError(BatchPipelineError):
    """An attempt whose fencing token is no longer current tried to record an outcome."""


# The systemic codes a stop can carry that are ours (the key, model or account is wrong: no retry can fix it); the
# rows that give them, and every other provider answer, are the one table in core/error_table.py.
SYSTEMIC_CODES = stop_codes()


# A provider batch that failed with one of these codes was refused for capacity, not for anything in it.
QUOTA_BATCH_CODES = quota_codes(Family.OPENAI)


def classify_line_error(code: str | None, status_code: int | None = None, message: str | None = None) -> ErrorClass:
    """Class of one failed request line inside a provider batch (the table's rows, any family: a line names none)."""
    kind = decide(None, status_code, code, message or "", where=Where.LINE).kind
    return (
        ErrorClass.SYSTEMIC
        if kind == Kind.SYSTEMIC
        else ErrorClass.POISON
        if kind == Kind.POISON
        else ErrorClass.TRANSIENT
    )


def provider_error(
    decision: Decision,
    message: str,
    *,
    code: str | None = None,
    retry_after_s: float | None = None,
    dimension: str | None = None,
    limit: int | None = None,
) -> BatchPipelineError:
    """The exception for a provider's answer the table decided (``message`` already redacted): a stop carries the
    row's code (else the provider's) and the row's advice; a quota refusal needs the ``dimension`` it refuses."""
    if decision.kind == Kind.SYSTEMIC:
        advice = f" ({decision.advice})" if decision.advice else ""
        return SystemicError(message + advice, code=decision.stop or code)
    if decision.kind == Kind.QUOTA and dimension is not None:
        return QuotaError(message, dimension=dimension, limit=limit, code=code, retry_after_s=retry_after_s)
    if decision.kind == Kind.POISON:
        return PoisonItemError(message)
    return TransientError(message, code=code, retry_after_s=retry_after_s)
