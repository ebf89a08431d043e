"""The error hierarchy: every failure says whether retrying can help.

- ``TransientError``: retry with backoff (429, 5xx, timeouts, an expired or preempted batch).
- ``PoisonItemError``: this one item will never succeed as sent (context too long, malformed); it is
  retried up to the per-item budget and then dead-lettered.
- ``SystemicError``: nothing will succeed until a human fixes something (bad key, unknown model, no credit);
  the job stops once, and no item's budget is spent on it.
"""

from enum import StrEnum


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

    def __init__(self, message: str, *, dimension: str, limit: int | None = None, code: str | None = None,
                 retry_after_s: float | None = None):
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


# Batch output line error codes and HTTP statuses -> error class. Unknown codes are transient only when
# the HTTP status says so; everything else per-item is poison (retried within the item's budget).
_TRANSIENT_LINE_CODES = frozenset(
    {"batch_expired", "batch_cancelled", "request_timeout", "server_error", "rate_limit_exceeded", "timeout",
     "connection_error", "overloaded_error", "api_error"}
)
# The one table of systemic codes (the key, model or account is wrong: no retry can fix it), for SDK errors and for
# the lines of a batch's output and error files alike.
SYSTEMIC_CODES = frozenset({"invalid_api_key", "model_not_found", "insufficient_quota", "billing_hard_limit_reached",
                            "account_deactivated", "unsupported_country_region_territory", "invalid_organization"})


# A provider batch that failed with one of these codes was refused for capacity, not for anything in it.
QUOTA_BATCH_CODES = frozenset({"token_limit_exceeded"})


def classify_line_error(code: str | None, status_code: int | None = None) -> ErrorClass:
    """Class of one failed request line inside a provider batch."""
    if code in SYSTEMIC_CODES or status_code in (401, 403):
        return ErrorClass.SYSTEMIC
    if code in _TRANSIENT_LINE_CODES:
        return ErrorClass.TRANSIENT
    if status_code is not None and (status_code == 429 or status_code >= 500 or status_code == 408):
        return ErrorClass.TRANSIENT
    return ErrorClass.POISON
