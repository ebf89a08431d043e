"""The one error table (core/error_table.py) through every provider's REAL SDK.

For each case the sandbox answers the create (or, online, the chat completion) with that HTTP status and code
(the ``http_error`` scenario, in the provider's own envelope), the SDK raises its own exception, and the adapter
(``translate`` of each batch executor, ``classify`` online) extracts status, code and message and asks the
table. Each case checks the class the adapter returns (written out here, not read off the table), the code a
stop carries, and that the row the table used is the one the sandbox's answer names: an adapter that read the
wrong code or status fails even where the class happens to agree. ``test_every_row_a_provider_can_produce_is_a_case``
keeps the cases and the table's rows together.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from batch_pipeline.core import error_table as et
from batch_pipeline.core.error_table import ROWS, Family, Where
from batch_pipeline.core.errors import QuotaError, SystemicError, TransientError
from batch_pipeline.core.ledger.executor import RequestPlan, ShardWork
from batch_pipeline.core.spec.job import BackendSpec
from batch_pipeline.core.spec.loading import parse_spec
from batch_pipeline.executors.online.executor import classify
from batch_pipeline.executors.online.transport import BodyBuilder, SdkTransport
from batch_pipeline.executors.registry import create_executor
from batch_pipeline.sandbox.anthropic.errors import injected_type as anthropic_type
from batch_pipeline.sandbox.bedrock.errors import injected_type as bedrock_type
from batch_pipeline.sandbox.google.errors import STATUS_NAMES as GOOGLE_NAMES

BACKENDS = {  # family -> (backend, model, settings, create endpoint, items)
    Family.OPENAI: ("openai_batch", "gpt-4o-mini", {}, "create_batch", 4),
    Family.AZURE: (
        "azure_openai_batch",
        "gpt-4o-mini",
        {"deployments": {"gpt-4o-mini": "labels-batch"}},
        "create_batch",
        4,
    ),
    Family.ANTHROPIC: ("anthropic_batch", "claude-sonnet-4-5", {}, "anthropic_create", 4),
    Family.GEMINI: ("gemini_batch", "gemini-2.5-flash", {}, "gemini_create", 4),
    Family.VERTEX: ("vertex_batch", "gemini-2.5-flash", {}, "vertex_create", 4),
    Family.BEDROCK: ("bedrock_batch", "anthropic.claude-3-5-haiku-20241022-v1:0", {}, "bedrock_create", 100),
}
T, Q, S, P = "transient", "quota", "systemic", "poison"
MODEL_404 = "The model `unknown-x` does not exist or you do not have access to it."
QUEUE_429 = "Enqueued token limit reached for the model. Limit: 2,000,000 enqueued tokens."
RATE_429 = "Rate limit reached for requests. Please try again in 20ms."

# (status, code, type, message, class at a create, the code a stop carries or None for "the provider's own")
# for every family: the rows by HTTP status
GENERIC: list[tuple[int, str | None, str | None, str, str, str | None]] = [
    (404, None, None, MODEL_404, S, "model_not_found"),
    (404, None, None, "Invalid URL (POST /v1/batches)", S, None),
    (404, None, None, "No such object", S, None),
    (408, None, None, "", T, None),
    (409, None, None, "", T, None),
    (429, None, None, RATE_429, T, None),
    (429, None, None, QUEUE_429, Q, None),
    (500, None, None, "", T, None),
    (503, None, None, "", T, None),
    (401, None, None, "", S, None),
    (403, None, None, "", S, None),
    (400, None, None, "", S, None),
    (422, None, None, "", S, None),
]
# Bedrock says a full queue as ServiceQuotaExceededException: a 429 is its throttle whatever it says
GENERIC_EXCEPTIONS = {(Family.BEDROCK, 429, QUEUE_429): T}
STOPS_BY_STATUS = {
    (Family.GEMINI, 401): "permission_denied",
    (Family.GEMINI, 403): "permission_denied",
    (Family.BEDROCK, 401): "access_denied",
    (Family.BEDROCK, 403): "access_denied",
    (Family.ANTHROPIC, 402): "credit_balance_too_low",
}
# each provider's documented codes
SPECIFIC: dict[Family, list[tuple[int, str | None, str | None, str, str, str | None]]] = {
    Family.OPENAI: [
        (429, "insufficient_quota", "insufficient_quota", "You exceeded your current quota", S, "insufficient_quota"),
        (429, None, "insufficient_quota", "You exceeded your current quota", S, "insufficient_quota"),
        (400, "billing_hard_limit_reached", None, "", S, "billing_hard_limit_reached"),
        (401, "invalid_api_key", None, "Incorrect API key provided", S, "invalid_api_key"),
        (401, "invalid_organization", None, "", S, "invalid_organization"),
        (401, "account_deactivated", None, "", S, "account_deactivated"),
        (403, "unsupported_country_region_territory", None, "", S, "unsupported_country_region_territory"),
        (404, "model_not_found", None, "not here", S, "model_not_found"),
        (400, "token_limit_exceeded", None, "", Q, None),
        (400, "context_length_exceeded", None, "", S, None),
        (500, "server_error", "server_error", "", T, None),
        (429, "rate_limit_exceeded", "requests", RATE_429, T, None),
        (
            429,
            "rate_limit_exceeded",
            "rate_limit_exceeded",
            "Rate limit reached for batch creation in organization "
            "org-1: 2 batches were created in the past hour. Limit: 2 batches per hour.",
            Q,
            None,
        ),
    ],
    Family.AZURE: [
        (404, "DeploymentNotFound", None, "The API deployment for this resource does not exist.", S, "model_not_found"),
        (400, "content_filter", None, "The response was filtered", S, None),
        (429, "insufficient_quota", "insufficient_quota", "You exceeded your current quota", S, "insufficient_quota"),
        (400, "token_limit_exceeded", None, "", Q, None),
    ],
    Family.ANTHROPIC: [
        (402, None, None, "", S, "credit_balance_too_low"),
        (400, None, "billing_error", "", S, "credit_balance_too_low"),
        (400, None, None, "Your credit balance is too low to access the Anthropic API.", S, "credit_balance_too_low"),
        (429, "enforced_spend_limit_reached", None, "", S, "billing_hard_limit_reached"),
        (429, "contract_spend_limit_reached", None, "", S, "billing_hard_limit_reached"),
        (400, None, None, "You have reached your specified workspace spend limit.", S, "billing_hard_limit_reached"),
        (400, "organization_on_hold", None, "", S, "account_deactivated"),
        (400, "region_not_supported", None, "", S, "unsupported_country_region_territory"),
        (413, None, None, "", S, None),
        (429, "ramp_limit_exceeded", None, "", T, None),
        (429, None, None, "Number of requests in the processing queue exceeds the limit. Limit: 100000", Q, None),
        (529, None, None, "Overloaded", T, None),
        (504, None, "timeout_error", "", T, None),
    ],
    Family.GEMINI: [
        (400, "API_KEY_INVALID", None, "API key not valid.", S, "invalid_api_key"),
        (400, "API_KEY_EXPIRED", None, "API key expired.", S, "invalid_api_key"),
        (403, "BILLING_DISABLED", None, "", S, "insufficient_quota"),
        (403, "CONSUMER_SUSPENDED", None, "", S, "account_deactivated"),
        (403, None, None, "This API method requires billing to be enabled.", S, "insufficient_quota"),
        (429, None, None, "This API method requires billing to be enabled.", S, "insufficient_quota"),
        (429, None, None, "Resource has been exhausted (e.g. check quota).", Q, None),
        # ErrorInfo RATE_LIMIT_EXCEEDED is not OpenAI's rate_limit_exceeded: a create refused for a quota waits
        (429, "RATE_LIMIT_EXCEEDED", None, "Quota exceeded for concurrent_batch_prediction_jobs. Limit: 1", Q, None),
        (429, "RATE_LIMIT_EXCEEDED", None, "Too many requests per minute", T, None),
        (400, None, "FAILED_PRECONDITION", "User location is not supported for the API use.", S, None),
        (400, None, "PERMISSION_DENIED", "", S, None),
        (400, None, "UNAUTHENTICATED", "", S, None),
        (409, None, "ALREADY_EXISTS", "", S, None),
        (499, None, "CANCELLED", "", T, None),
        (501, None, "UNIMPLEMENTED", "", S, None),
        (504, None, "DEADLINE_EXCEEDED", "", T, None),
    ],
    Family.BEDROCK: [
        (403, "AccessDeniedException", None, "INVALID_PAYMENT_INSTRUMENT", S, "access_denied"),
        *(
            (403, name, None, "", S, "access_denied")
            for name in (
                "UnrecognizedClientException",
                "InvalidSignatureException",
                "ExpiredTokenException",
                "MissingAuthenticationTokenException",
                "InvalidClientTokenId",
                "SignatureDoesNotMatch",
                "InvalidAccessKeyId",
                "AccessDenied",
            )
        ),
        (400, "ServiceQuotaExceededException", None, "You have 2 batch inference jobs in progress", Q, None),
        (400, "ValidationException", None, "The provided model identifier is invalid.", S, "model_not_found"),
        (400, "ValidationException", None, "records below the minimum", S, None),
        (404, "ResourceNotFoundException", None, "The specified job does not exist.", S, None),
        (409, "ConflictException", None, "", T, None),
        (429, "ThrottlingException", None, "quota", T, None),
        (429, "TooManyRequestsException", None, "", T, None),
        (429, "ModelNotReadyException", None, "", T, None),
        (408, "ModelTimeoutException", None, "", T, None),
        (424, "ModelErrorException", None, "", S, None),
        (500, "InternalServerException", None, "", T, None),
        (503, "ServiceUnavailableException", None, "", T, None),
        (408, "RequestTimeout", None, "", T, None),
        (408, "RequestTimeoutException", None, "", T, None),
    ],
}
SPECIFIC[Family.VERTEX] = [case for case in SPECIFIC[Family.GEMINI] if case[1] != "API_KEY_EXPIRED"]
# online (the OpenAI family, one request per item): poison is the item's own; every 404 stops the job
ONLINE: list[tuple[int, str | None, str | None, str, str, str | None]] = [
    (404, None, None, '{"detail": "Not Found"}', S, None),
    (404, None, None, MODEL_404, S, "model_not_found"),
    (404, None, None, "Invalid URL (POST /v1/chat/completions)", S, None),
    (400, "context_length_exceeded", None, "This model's maximum context length is 128000 tokens.", P, None),
    (400, None, None, "", P, None),
    (422, None, None, "", P, None),
    (401, "invalid_api_key", None, "", S, "invalid_api_key"),
    (403, None, None, "", S, None),
    (429, "insufficient_quota", "insufficient_quota", "You exceeded your current quota", S, "insufficient_quota"),
    (429, "rate_limit_exceeded", "requests", RATE_429, T, None),
    (429, None, None, QUEUE_429, T, None),  # not a create: the queue words mean nothing here
    (408, None, None, "", T, None),
    (409, None, None, "", T, None),
    (500, None, None, "", T, None),
    (503, None, None, "", T, None),
]
# rows no HTTP answer to a call can reach: the codes of batch lines and of our own transports (the line and
# connection tests cover them)
NOT_AN_HTTP_ANSWER = {"batch_expired", "batch_cancelled", "request_timeout", "timeout", "connection_error"}


def cases() -> list[tuple[Family, int, str | None, str | None, str, str, str | None]]:
    found = []
    for family in BACKENDS:
        for status, code, type_, message, expected, stop in GENERIC:
            expected = GENERIC_EXCEPTIONS.get((family, status, message), expected)
            found.append(
                (
                    family,
                    status,
                    code,
                    type_,
                    message,
                    expected,
                    stop or (STOPS_BY_STATUS.get((family, status)) if expected == S else None),
                )
            )
        found += [(family, *case) for case in SPECIFIC[family]]
    return found


CASES = cases()


def case_id(case: tuple[Any, ...]) -> str:
    family, status, code, type_, message = case[:5]
    return f"{family.value}-{status}-{code or type_ or (message[:18] if message else 'plain')}"


def answer_as_sent(
    family: Family, status: int, code: str | None, type_: str | None, message: str
) -> tuple[str | None, str | None, str]:
    """(code, reason, message) as the sandbox sends them and the adapter must read them off the SDK's exception."""
    message = message or f"Injected HTTP {status} (sandbox scenario http_error)."
    if family in (Family.OPENAI, Family.AZURE):
        return code, type_ or ("server_error" if status >= 500 else "invalid_request_error"), message
    if family == Family.ANTHROPIC:
        return type_ or anthropic_type(status), code, message
    if family in (Family.GEMINI, Family.VERTEX):
        return (type_ or GOOGLE_NAMES.get(status, "UNKNOWN")).lower(), code, message
    return code or bedrock_type(status), None, message


REAL_LOOKUP = et.lookup  # the table's own: the fixture below records the executors' calls of it


def row_named(family: Family, status: int, code: str | None, type_: str | None, message: str, where: Where) -> et.Row:
    sent, reason, text = answer_as_sent(family, status, code, type_, message)
    return REAL_LOOKUP(family, status, tuple(c.lower() for c in (sent, reason) if c), text, where)


@pytest.fixture
def sandbox(vertex_sandbox, monkeypatch):
    """The sandbox (with its GCS emulator for Vertex), no real key of any provider in reach, and every row the
    table is asked for recorded."""
    for name in (
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "AZURE_OPENAI_API_KEY",
        "AZURE_OPENAI_AD_TOKEN",
        "AZURE_OPENAI_ENDPOINT",
        "OPENAI_API_VERSION",
        "GOOGLE_GEMINI_BASE_URL",
    ):
        monkeypatch.delenv(name, raising=False)
    asked: list[et.Row] = []
    real = et.lookup

    def recording(*args: Any, **kwargs: Any) -> et.Row:
        row = real(*args, **kwargs)
        asked.append(row)
        return row

    monkeypatch.setattr(et, "lookup", recording)
    vertex_sandbox.asked = asked
    return vertex_sandbox


def work(family: Family) -> ShardWork:
    backend, model, settings, _, n = BACKENDS[family]
    spec = parse_spec(f"""
name: et
input: {{path: in.jsonl, text_field: body}}
prompt: {{version: v1, system: "Label it.", template: "{{body}}"}}
model: {model}
backend: {{name: {backend}, settings: {{sandbox: true}}}}
sampling: {{max_tokens: 16}}
output: {{choice: [billing, bug, other]}}
""")
    items = pa.table(
        {
            "request_id": [f"{i:064x}" for i in range(n)],
            "user_prompt": [f"ticket {i}: my invoice is wrong" for i in range(n)],
        }
    )
    return ShardWork("et", "s00001", 1, "et:s00001:1", RequestPlan.from_spec(spec), items)


def check(error: BaseException, expected: str, stop: str | None, row_code: str | None) -> None:
    if expected == Q:
        assert isinstance(error, QuotaError), repr(error)
    elif expected == T:
        assert isinstance(error, TransientError) and not isinstance(error, QuotaError), repr(error)
    else:
        assert isinstance(error, SystemicError), repr(error)
        assert error.code == (stop or row_code), (error.code, stop, row_code)
    assert "sk-sandbox" not in str(error)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_a_create_refused_so_raises_the_rows_class_through_the_real_sdk(sandbox, case):
    family, status, code, type_, message, expected, stop = case
    backend, _, settings, endpoint, _ = BACKENDS[family]
    sandbox.set_scenario(
        "http_error", status=status, code=code or "", type=type_ or "", message=message, times=1000, on=[endpoint]
    )
    executor = create_executor(BackendSpec(name=backend, settings={"sandbox": True, "max_retries": 0, **settings}))
    sandbox.asked.clear()
    with pytest.raises(Exception) as raised:
        executor.submit(work(family))
    assert [r["status"] for r in sandbox.requests() if r["status"] == status], "the sandbox never answered so"
    wanted = row_named(family, status, code, type_, message, Where.CREATE)
    assert wanted in sandbox.asked, (wanted.why, [r.why for r in sandbox.asked])
    sent, _, _ = answer_as_sent(family, status, code, type_, message)
    check(raised.value, expected, stop, sent)
    assert sandbox.ledger() == []


@pytest.mark.parametrize("case", ONLINE, ids=lambda c: case_id((Family.OPENAI, *c)))
def test_an_online_request_answered_so_is_classified_by_the_row_through_the_real_sdk(sandbox, case):
    status, code, type_, message, expected, stop = case
    sandbox.set_scenario(
        "http_error",
        status=status,
        code=code or "",
        type=type_ or "",
        message=message,
        times=1000,
        on=["chat_completions"],
    )
    transport = SdkTransport(sandbox.base_url + "/v1", "sk-sandbox", 10, 1, BodyBuilder(work(Family.OPENAI).plan, {}))
    try:
        sandbox.asked.clear()
        reply = transport.send("ticket 1: my invoice is wrong", 0)
        outcome = classify(reply)
    finally:
        transport.close()
    assert reply.status == status
    assert sandbox.asked == [row_named(Family.OPENAI, status, code, type_, message, Where.REQUEST)]
    assert outcome.kind == expected
    if expected == S:  # a stop carries the row's code, else the provider's code, else its type
        sent, kind, _ = answer_as_sent(Family.OPENAI, status, code, type_, message)
        assert outcome.code == (stop or sent or kind)


def test_every_row_a_provider_can_produce_is_a_case():
    reached = {id(row_named(c[0], *c[1:5], Where.CREATE)) for c in CASES}
    reached |= {id(row_named(Family.OPENAI, *c[:4], Where.REQUEST)) for c in ONLINE}
    missing = [row.why for row in ROWS if id(row) not in reached and (row.code or "") not in NOT_AN_HTTP_ANSWER]
    assert missing == []


def test_the_cases_expect_what_the_table_says():
    """The written-out classes are the table's (so a row changed without its case, or the reverse, fails here
    first, without a sandbox)."""
    kinds = {et.Kind.SYSTEMIC: S, et.Kind.TRANSIENT: T, et.Kind.QUOTA: Q, et.Kind.POISON: P}
    for case in CASES:
        family, status, code, type_, message, expected, _ = case
        sent, reason, text = answer_as_sent(family, status, code, type_, message)
        assert kinds[et.decide(family, status, sent, text, reason=reason, where=Where.CREATE).kind] == expected, case
    for case in ONLINE:
        status, code, type_, message, expected, _ = case
        sent, reason, text = answer_as_sent(Family.OPENAI, status, code, type_, message)
        assert (
            kinds[et.decide(Family.OPENAI, status, sent, text, reason=reason, where=Where.REQUEST).kind] == expected
        ), case
