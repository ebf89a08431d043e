"""The one table that says what a provider's error means: (family, HTTP status, code) -> transient, poison,
systemic or quota.

An adapter only extracts what its SDK's exception carries (the HTTP status; the provider's code, type or
exception name; a second code where the provider has one: Google's ``ErrorInfo.reason``, Anthropic's
``error.details.error_code``; the message; the requested wait) and asks ``decide``. The batch output lines are
classified by the same rows (``Where.LINE``: a line carries no family, so every family's rows apply; a test
checks that this never gives a line another class than its own family's rows would).

The first row that matches wins (rows run from the particular to the general). A row matches when the family
is one of its families (none: every family), the status is its status (a number, several, a range; None: any),
its code equals the answer's code or reason (case-insensitive; None: any), its ``when`` pattern is found in the
message and the answer was given where the row applies (``where``).

What a row's kind becomes depends on where the answer came from:
- ``QUOTA`` ("not now": the account's queue is full) is a ``QuotaError`` only for a create; anywhere else the
  same answer is transient (the call is asked again, nothing waits on room).
- ``POISON`` ("this, as sent, never succeeds") is a per-item failure for an online request or an output line
  (retried within the item's budget, then dead-lettered); for a control-plane call (a create, a retrieve, a list)
  there is no item to blame, so it stops the job (``SYSTEMIC``) with the provider's message.
- An online reply's ``x-should-retry`` header, when given, decides between transient and poison (never a stop).

Settled here (the adapters disagreed before): 409 is transient for every provider (both SDKs retry it, Google's
ABORTED says "retry", Bedrock's ConflictException is a concurrent change; only Google's ALREADY_EXISTS is not);
408 is transient for every provider (Bedrock's included); a 404 stops the job when it names the model or the
endpoint (online: every 404, whose only lookups are the model and the path), and is otherwise poison: a line's
own problem, or, for a call, the batch or file it names is gone (which stops the job).
"""

import functools
import re
from dataclasses import dataclass
from enum import StrEnum


class Family(StrEnum):
    OPENAI = "openai"  # OpenAI's Batch API and the online endpoint (any OpenAI-compatible server)
    AZURE = "azure"  # Azure OpenAI (the same envelope; its own codes)
    ANTHROPIC = "anthropic"
    GEMINI = "gemini"  # the Gemini Developer API
    VERTEX = "vertex"  # Vertex AI batch prediction
    BEDROCK = "bedrock"


class Kind(StrEnum):
    TRANSIENT = "transient"  # retry with backoff (the provider's wait wins)
    POISON = "poison"  # this item, as sent, never succeeds
    SYSTEMIC = "systemic"  # nothing succeeds until a human fixes something: stop the job once
    QUOTA = "quota"  # the account's queue is full: the shard waits for room (a create only)


class Where(StrEnum):
    CALL = "call"  # a control-plane call: upload, retrieve, list, cancel, delete, download
    CREATE = "create"  # the call that creates a batch or job
    REQUEST = "request"  # one online request (one item)
    LINE = "line"  # one failed line of a batch's output (one item)


EVERYWHERE = frozenset(Where)
Status = int | tuple[int, ...] | range | None

OPENAI_LIKE = (Family.OPENAI, Family.AZURE)
GOOGLE = (Family.GEMINI, Family.VERTEX)
ANY: tuple[Family, ...] = ()
SERVER = range(500, 600)

# the message names the model (not "model-invocation-job", not "model_not_found")
NAMES_MODEL = re.compile(r"\bmodels?\b(?![-_])", re.IGNORECASE)
# the message names the endpoint: OpenAI's 404 "Invalid URL (POST /v1/...)", a server without the path
NAMES_ENDPOINT = re.compile(r"\binvalid url\b|\b(?:unknown|unsupported|invalid) (?:url|endpoint|path)\b", re.IGNORECASE)
# what a create refused for the account's queue says, as opposed to a plain rate limit: OpenAI "Enqueued token
# limit ... Limit: N", Anthropic "... processing queue ...", Google RESOURCE_EXHAUSTED "... quota ..."
QUEUE_WORDS = re.compile(r"enqueued|queue|per hour|concurrent|quota|limit:", re.IGNORECASE)
# Google: the project has no billing (Gemini's free-tier "check your plan and billing details" is a rate limit)
NO_BILLING = re.compile(
    r"enable billing|billing to be enabled|billing (?:is|has) not (?:been )?enabled|"
    r"billing (?:account )?(?:is )?disabled",
    re.IGNORECASE,
)

_RESUME = "then re-run to resume"
OPENAI_ADVICE = f"check the API key, model and account; {_RESUME}"
ANTHROPIC_ADVICE = f"check the API key and its workspace; {_RESUME}"
GEMINI_KEY_ADVICE = f"check the API key and its project; {_RESUME}"
GEMINI_BILLING_ADVICE = f"check the API key and the project's billing; {_RESUME}"
VERTEX_ADVICE = f"check the Google credentials, the project and its IAM roles; {_RESUME}"
BEDROCK_ADVICE = f"check the AWS credentials, the role_arn and model access in the Bedrock console; {_RESUME}"
MODEL_ADVICE = "unknown model: check `model` in the job spec"
ENDPOINT_ADVICE = f"no such endpoint: check `base_url` in backend.settings; {_RESUME}"
CREDIT_ADVICE = f"the account has no credit left; add credit, {_RESUME}"
SPEND_ADVICE = f"the account or workspace reached its spend limit; raise it, {_RESUME}"


@dataclass(frozen=True)
class Row:
    families: tuple[Family, ...]  # () = every family
    status: Status  # None = any status (or none at all)
    code: str | None  # the provider's code, type, exception name or reason; None = any
    kind: Kind
    why: str  # the reason for the row, from the provider's documentation
    when: re.Pattern[str] | None = None
    where: frozenset[Where] = EVERYWHERE
    stop: str | None = None  # the code a stop carries (None: the provider's own)
    advice: str = ""  # said after a stop's message

    def matches(
        self, family: Family | None, status: int | None, codes: tuple[str, ...], message: str, where: Where
    ) -> bool:
        return self.keyed(family, status, codes, where) and (self.when is None or bool(self.when.search(message)))

    def keyed(self, family: Family | None, status: int | None, codes: tuple[str, ...], where: Where) -> bool:
        """Everything but the message matches."""
        if where not in self.where:
            return False
        if self.families and family is not None and family not in self.families:
            return False
        if self.status is not None and not _status_in(status, self.status):
            return False
        return self.code is None or self.code.lower() in codes


def _status_in(status: int | None, wanted: Status) -> bool:
    if status is None:
        return False
    if isinstance(wanted, int):
        return status == wanted
    return status in wanted  # type: ignore[operator]


def _only(*where: Where) -> frozenset[Where]:
    return frozenset(where)


T, P, S, Q = Kind.TRANSIENT, Kind.POISON, Kind.SYSTEMIC, Kind.QUOTA

# one row per line, so the table reads as a table
# fmt: off
ROWS: tuple[Row, ...] = (
    # -- the model or the endpoint is wrong: every request would get the same answer ---------------------------
    Row(ANY, 404, None, S, "a 404 that names the model: the backend has no such model (or the key may not use "
        "it); no request can succeed", when=NAMES_MODEL, stop="model_not_found", advice=MODEL_ADVICE),
    Row(ANY, 404, None, S, "a 404 that names the endpoint (OpenAI's 'Invalid URL (POST ...)'): base_url or the "
        "path is wrong for every request", when=NAMES_ENDPOINT, advice=ENDPOINT_ADVICE),
    Row((Family.OPENAI,), 404, None, S, "online: a chat-completions request looks up only the model and the "
            "path, nothing in one item's body, so a 404 (vLLM's unknown model, a server without /v1) is every "
            "request's", where=_only(Where.REQUEST), advice=OPENAI_ADVICE),
    # -- OpenAI and Azure (platform.openai.com/docs/guides/error-codes; Azure OpenAI's REST errors) -----------
    # the codes that stop the job, each stop carrying the code itself
    *(Row(OPENAI_LIKE, None, code, S, why, stop=code, advice=advice) for code, why, advice in (
        ("insufficient_quota", "429 'You exceeded your current quota': no credit left or the monthly budget "
         "spent; OpenAI sends x-should-retry: false, no wait brings it back", CREDIT_ADVICE),
        ("billing_hard_limit_reached", "the organization's own spend limit is reached", SPEND_ADVICE),
        ("invalid_api_key", "401 'Incorrect API key provided'", OPENAI_ADVICE),
        ("invalid_organization", "401: the key belongs to no organization it may use", OPENAI_ADVICE),
        ("account_deactivated", "401: the account or project is deactivated", OPENAI_ADVICE),
        ("unsupported_country_region_territory", "403 'Country, region, or territory not supported'",
         OPENAI_ADVICE),
        ("model_not_found", "the model does not exist or the key may not use it", MODEL_ADVICE))),
    Row((Family.AZURE,), None, "DeploymentNotFound", S, "Azure: no deployment of that name in the resource (the "
        "line's model is the deployment name)", stop="model_not_found", advice=MODEL_ADVICE),
    Row(OPENAI_LIKE, None, "token_limit_exceeded", Q, "a batch failed in validation for the model's enqueued "
        "token limit: nothing runs until in-progress batches finish (a failed batch's code, checked on collect)"),
    Row(OPENAI_LIKE, 400, "context_length_exceeded", P, "the prompt is longer than the model's context: this item "
        "never fits"),
    Row((Family.AZURE,), 400, "content_filter", P, "Azure's content filter refused this prompt"),
    # -- Anthropic (docs.claude.com/en/api/errors; the SDK's (status, error_code) classes) ---------------------
    Row((Family.ANTHROPIC,), (401, 403), None, S, "401 authentication_error (the key), 403 permission_error (the "
        "key may not use the resource)", advice=ANTHROPIC_ADVICE),
    Row((Family.ANTHROPIC,), 402, None, S, "402 billing_error: a billing problem of the account",
        stop="credit_balance_too_low", advice=CREDIT_ADVICE),
    Row((Family.ANTHROPIC,), None, "billing_error", S, "billing_error under any status", stop="credit_balance_too_low",
        advice=CREDIT_ADVICE),
    Row((Family.ANTHROPIC,), None, None, S, "400 invalid_request_error 'Your credit balance is too low'",
        when=re.compile(r"credit balance", re.IGNORECASE), stop="credit_balance_too_low", advice=CREDIT_ADVICE),
    Row((Family.ANTHROPIC,), None, "enforced_spend_limit_reached", S, "429 with no retry-after: the tier's "
        "monthly spend limit; usage is paused until next month or a higher tier", stop="billing_hard_limit_reached",
        advice=SPEND_ADVICE),
    Row((Family.ANTHROPIC,), None, "contract_spend_limit_reached", S, "429: the contract's spend limit",
        stop="billing_hard_limit_reached", advice=SPEND_ADVICE),
    Row((Family.ANTHROPIC,), 400, None, S, "400 invalid_request_error: usage reached the spend limit set for the "
        "organization or workspace", when=re.compile(r"spend(?:ing)? limit", re.IGNORECASE),
        stop="billing_hard_limit_reached", advice=SPEND_ADVICE),
    Row((Family.ANTHROPIC,), None, "organization_on_hold", S, "400: the organization is on hold",
        stop="account_deactivated", advice=ANTHROPIC_ADVICE),
    Row((Family.ANTHROPIC,), None, "region_not_supported", S, "400: the request comes from an unsupported region",
        stop="unsupported_country_region_territory", advice=ANTHROPIC_ADVICE),
    Row((Family.ANTHROPIC,), 413, "request_too_large", P, "413: over the size limit (256 MB for a batch, 32 MB for "
        "one request): this, as sent, never fits"),
    Row((Family.ANTHROPIC,), 429, "ramp_limit_exceeded", T, "429: usage grew faster than the acceleration limit; "
        "it passes with time"),
    # -- Gemini and Vertex (ai.google.dev/gemini-api/docs/troubleshooting, Vertex's error codes, google.rpc.Code) -
    # the ErrorInfo reasons that stop the job, each with the stop code that says the same
    *(Row(GOOGLE, None, reason, S, why, stop=stop, advice=GEMINI_BILLING_ADVICE) for reason, stop, why in (
        ("API_KEY_INVALID", "invalid_api_key", "ErrorInfo API_KEY_INVALID (400 INVALID_ARGUMENT): the key is wrong"),
        ("API_KEY_EXPIRED", "invalid_api_key", "ErrorInfo API_KEY_EXPIRED: renew the key"),
        ("BILLING_DISABLED", "insufficient_quota", "ErrorInfo BILLING_DISABLED (403): the project has no billing"),
        ("CONSUMER_SUSPENDED", "account_deactivated", "ErrorInfo CONSUMER_SUSPENDED: the project is suspended"))),
    Row(GOOGLE, (403, 429), None, S, "403/429 'This API method requires billing to be enabled'",
        when=NO_BILLING, stop="insufficient_quota", advice="billing is not enabled on the project"),
    Row((Family.GEMINI,), (401, 403), None, S, "401 UNAUTHENTICATED, 403 PERMISSION_DENIED: the key or its "
        "project may not do this", stop="permission_denied", advice=GEMINI_KEY_ADVICE),
    Row((Family.VERTEX,), (401, 403), None, S, "401 UNAUTHENTICATED, 403 PERMISSION_DENIED: the credentials or "
        "the project's IAM roles", advice=VERTEX_ADVICE),
    Row(GOOGLE, None, "unauthenticated", S, "UNAUTHENTICATED under another status", advice=VERTEX_ADVICE),
    Row(GOOGLE, None, "permission_denied", S, "PERMISSION_DENIED under another status", advice=VERTEX_ADVICE),
    Row(GOOGLE, 400, "failed_precondition", S, "400 FAILED_PRECONDITION: the free tier is not served in the "
        "region and billing is off; no retry changes it", advice=GEMINI_BILLING_ADVICE),
    Row(GOOGLE, 409, "already_exists", P, "409 ALREADY_EXISTS: what the call creates exists; asked again, the "
        "answer is the same (google.rpc.Code: do not retry)"),
    Row(GOOGLE, 499, "cancelled", T, "499 CANCELLED: the request was cancelled (its batch, the client), not "
        "refused; sent again it can succeed"),
    Row(GOOGLE, 501, "unimplemented", P, "501 UNIMPLEMENTED: the method is not served; no retry makes it so"),
    # -- Bedrock (botocore's bedrock service model; bedrock-runtime's errors for a line's errorCode) -----------
    Row((Family.BEDROCK,), None, "AccessDeniedException", S, "403: the credentials or the role may not run the "
        "job or use the model (also how a missing payment instrument is said)", stop="access_denied",
        advice=BEDROCK_ADVICE),
    *(Row((Family.BEDROCK,), None, name, S, "the AWS credentials are not valid", stop="access_denied",
          advice=BEDROCK_ADVICE)
      for name in ("UnrecognizedClientException", "InvalidSignatureException", "ExpiredTokenException",
                   "MissingAuthenticationTokenException", "InvalidClientTokenId", "SignatureDoesNotMatch",
                   "InvalidAccessKeyId", "AccessDenied")),
    Row((Family.BEDROCK,), (401, 403), None, S, "401/403 under another name", stop="access_denied",
        advice=BEDROCK_ADVICE),
    Row((Family.BEDROCK,), None, "ServiceQuotaExceededException", Q, "400: the account's submitted and "
        "in-progress jobs for the model are at the quota; a job ending frees room"),
    Row((Family.BEDROCK,), 400, "ValidationException", S, "400 'The provided model identifier is invalid'",
        when=re.compile(r"model identifier", re.IGNORECASE), stop="model_not_found", advice=MODEL_ADVICE),
    Row((Family.BEDROCK,), 400, "ValidationException", P, "400: the input does not satisfy the API's constraints "
        "(records below the minimum, a bad field)"),
    Row((Family.BEDROCK,), 404, "ResourceNotFoundException", P, "404: the job (or a line's resource) does not "
        "exist"),
    Row((Family.BEDROCK,), None, "ConflictException", T, "409: a conflicting change was in progress; settled by "
        "asking again (a create with the same clientRequestToken is the same job)"),
    Row((Family.BEDROCK,), None, "ThrottlingException", T, "429: a rate limit; Bedrock says a full queue as "
        "ServiceQuotaExceededException, never as a throttle"),
    Row((Family.BEDROCK,), None, "TooManyRequestsException", T, "429 under its older name"),
    Row((Family.BEDROCK,), None, "ModelNotReadyException", T, "429: the model is not ready yet; the SDK retries it"),
    Row((Family.BEDROCK,), None, "ModelTimeoutException", T, "408: the model took too long on this request"),
    Row((Family.BEDROCK,), None, "ModelErrorException", P, "424: the model failed on this input"),
    Row((Family.BEDROCK,), None, "InternalServerException", T, "500: Bedrock's own failure"),
    Row((Family.BEDROCK,), None, "ServiceUnavailableException", T, "503: Bedrock is unavailable"),
    Row((Family.BEDROCK,), None, "RequestTimeout", T, "a request that timed out"),
    Row((Family.BEDROCK,), None, "RequestTimeoutException", T, "a request that timed out"),
    # -- a queue refusal: after every stop above, before any transient code (OpenAI's per-hour refusal is a 429
    # rate_limit_exceeded that names its limit; Bedrock's throttle above never is one) ----------------------------
    Row(ANY, 429, None, Q, "429 on a create that names the account's queue (enqueued tokens, processing queue, "
        "quota, concurrent jobs, batches per hour): nothing was created; the shard waits for room",
        when=QUEUE_WORDS),
    # -- the codes of batch lines and of our own transports (each its family's: Google's ErrorInfo reason
    # RATE_LIMIT_EXCEEDED on a create that names a quota is a queue refusal, not OpenAI's rate_limit_exceeded) ----
    *(Row(families, None, code, T, why) for families, code, why in (
        ((*OPENAI_LIKE, Family.ANTHROPIC), "batch_expired", "OpenAI and Anthropic: the batch's window ended before "
         "this request ran"),
        ((*OPENAI_LIKE, Family.ANTHROPIC), "batch_cancelled", "OpenAI and Anthropic: the batch was cancelled before "
         "this request ran"),
        (OPENAI_LIKE, "request_timeout", "OpenAI: the request timed out inside the batch"),
        (OPENAI_LIKE, "server_error", "OpenAI: 500 'The server had an error while processing your request'"),
        (OPENAI_LIKE, "rate_limit_exceeded", "OpenAI: 429 'Rate limit reached'"),
        ((Family.ANTHROPIC,), "api_error", "Anthropic: 500 api_error, an unexpected error inside Anthropic"),
        ((Family.ANTHROPIC,), "overloaded_error", "Anthropic: 529, the API is overloaded for everyone"),
        ((Family.ANTHROPIC,), "timeout_error", "Anthropic: 504, the request timed out"),
        (ANY, "timeout", "no answer within the timeout (our transport)"),
        (ANY, "connection_error", "no answer at all: the connection failed (our transport)"))),
    # -- by HTTP status, for every provider --------------------------------------------------------------------
    Row(ANY, (401, 403), None, S, "401 the credentials (OpenAI's 'Invalid Authentication', Azure's 'Access "
        "denied due to invalid subscription key'), 403 a resource or region the key may not use: a human must fix "
        "them", advice=OPENAI_ADVICE),
    Row(ANY, 404, None, P, "a 404 that names neither the model nor the endpoint: a line's own request, or the "
        "batch, file or result a call names is gone (retrying finds nothing)"),
    Row(ANY, 408, None, T, "408 Request Timeout: both SDKs retry it; Bedrock's ModelTimeoutException too"),
    Row(ANY, 409, None, T, "409 Conflict: a concurrent change (both SDKs retry it; Google's ABORTED: 'retry at a "
        "higher level'); providers answer 400 for a conflict that retrying cannot settle"),
    Row(ANY, 429, None, T, "429 Too Many Requests: a rate limit; wait as long as retry-after says"),
    Row(ANY, SERVER, None, T, "5xx: the provider's own failure (500, 502, 503, 504, Anthropic's 529); retry "
        "with backoff"),
    Row(ANY, None, None, P, "any other answer (another 4xx, an unknown line code): this, as sent, is refused; an "
        "item is retried within its budget, a call stops the job with the provider's message"),
)
# fmt: on


@dataclass(frozen=True)
class Decision:
    """What one provider answer means where it was given: ``kind`` is final (see the module docstring)."""

    kind: Kind
    row: Row

    @property
    def stop(self) -> str | None:
        return self.row.stop

    @property
    def advice(self) -> str:
        return self.row.advice


def lookup(family: Family | None, status: int | None, codes: tuple[str, ...], message: str, where: Where) -> Row:
    """The first row that matches an answer's key (``codes``: its code and reason, lower case) and its message;
    the last row matches anything."""
    for row in _keyed(family, status, codes, where):
        if row.when is None or row.when.search(message):
            return row
    raise AssertionError("the table's last row matches every answer")


@functools.lru_cache(maxsize=4096)
def _keyed(family: Family | None, status: int | None, codes: tuple[str, ...], where: Where) -> tuple[Row, ...]:
    """The rows that match an answer's key, in order, up to the first that needs no message (a batch's failed
    lines share a few keys: each line then costs a dictionary lookup and a pattern or two)."""
    found = []
    for row in ROWS:
        if row.keyed(family, status, codes, where):
            found.append(row)
            if row.when is None:
                break
    return tuple(found)


def decide(
    family: Family | None,
    status: int | None,
    code: str | None = None,
    message: str = "",
    *,
    reason: str | None = None,
    where: Where = Where.CALL,
    should_retry: bool | None = None,
) -> Decision:
    """What an answer means: its row, and the row's kind as it stands where the answer was given."""
    codes = ((str(code).lower(),) if code else ()) + ((str(reason).lower(),) if reason else ())
    row = lookup(family, status, codes, message or "", where)
    kind = row.kind
    if should_retry is not None and kind in (Kind.TRANSIENT, Kind.POISON):
        kind = Kind.TRANSIENT if should_retry else Kind.POISON
    if kind == Kind.QUOTA and where != Where.CREATE:
        kind = Kind.TRANSIENT
    if kind == Kind.POISON and where in (Where.CALL, Where.CREATE):
        kind = Kind.SYSTEMIC
    return Decision(kind, row)


def stop_codes() -> frozenset[str]:
    """Every code a stop from this table can carry that is the table's own (the others are the provider's)."""
    return frozenset(row.stop for row in ROWS if row.kind == Kind.SYSTEMIC and row.stop)


def quota_codes(family: Family) -> frozenset[str]:
    """The codes that mean "the account's queue is full" for ``family`` whatever the status."""
    return frozenset(
        row.code for row in ROWS if row.kind == Kind.QUOTA and row.code and (not row.families or family in row.families)
    )


def reason_stops(family: Family) -> dict[str, str]:
    """Google: ``ErrorInfo`` reasons (upper case) that stop the job -> the code the stop carries."""
    return {
        row.code: row.stop
        for row in ROWS
        if row.kind == Kind.SYSTEMIC and row.stop and row.code and row.code.isupper() and family in row.families
    }
