"""The one error table (core/error_table.py) on its own: every row is reachable, the settled disagreements hold for
every provider, where an answer came from changes what it means as documented, lines agree across families, and
every stop code it gives has a troubleshooting row."""

import re

import pytest

from batch_pipeline.core import error_table as et
from batch_pipeline.core.error_table import ROWS, Family, Kind, Where, decide
from batch_pipeline.core.errors import (
    ErrorClass,
    QuotaError,
    SystemicError,
    TransientError,
    classify_line_error,
    provider_error,
)
from batch_pipeline.core.troubleshooting import TROUBLES, TroubleKind

# a message each ``when`` pattern of the table finds
SAMPLES = {
    et.NAMES_MODEL.pattern: "The model `gpt-9` does not exist or you do not have access to it.",
    et.NAMES_ENDPOINT.pattern: "Invalid URL (POST /v1/chat/completion)",
    et.QUEUE_WORDS.pattern: "Enqueued token limit reached for gpt-4o. Limit: 2,000,000 enqueued tokens.",
    et.NO_BILLING.pattern: "This API method requires billing to be enabled.",
    "credit balance": "Your credit balance is too low to access the Anthropic API.",
    r"spend(?:ing)? limit": "You have reached your specified workspace spend limit.",
    "model identifier": "The provided model identifier is invalid.",
}


def _first_status(status: et.Status) -> int | None:
    if status is None or isinstance(status, int):
        return status
    return next(iter(status))


def probe(row: et.Row) -> dict:
    """An answer built from the row's own key (its first family, status, code, a message its pattern finds)."""
    message = SAMPLES[row.when.pattern] if row.when is not None else ""
    where = Where.CREATE if row.kind == Kind.QUOTA else Where.CALL if Where.CALL in row.where else min(row.where)
    return {
        "family": row.families[0] if row.families else Family.OPENAI,
        "status": _first_status(row.status),
        "code": row.code if row.code is not None else "something_unlisted",
        "message": message,
        "where": where,
    }


def test_every_when_pattern_has_a_sample_it_matches():
    patterns = {row.when.pattern for row in ROWS if row.when is not None}
    assert patterns <= set(SAMPLES), patterns - set(SAMPLES)
    for pattern, text in SAMPLES.items():
        assert re.search(pattern, text, re.IGNORECASE), pattern


@pytest.mark.parametrize("index", range(len(ROWS)), ids=lambda i: f"{i}:{ROWS[i].code or ROWS[i].status}")
def test_every_row_is_reachable_from_its_own_key(index):
    """No row is shadowed by an earlier one (first match wins)."""
    row = ROWS[index]
    p = probe(row)
    assert decide(p["family"], p["status"], p["code"], p["message"], where=p["where"]).row is row


def test_every_row_says_why_and_the_last_row_takes_anything():
    assert all(len(row.why) > 10 for row in ROWS)
    last = ROWS[-1]
    assert last.families == () and last.status is None and last.code is None and last.when is None
    assert decide(None, None, None, where=Where.LINE).row is last and last.kind == Kind.POISON


def test_rows_never_repeat_a_key():
    keys = [
        (row.families, row.status, (row.code or "").lower(), row.when and row.when.pattern, row.where) for row in ROWS
    ]
    assert len(keys) == len(set(keys))


# -- the disagreements, settled once for every provider --------------------------------------------------------
@pytest.mark.parametrize("family", list(Family))
def test_409_and_408_are_transient_for_every_provider(family):
    for status in (408, 409):
        for where in (Where.CALL, Where.CREATE, Where.REQUEST, Where.LINE):
            assert decide(family, status, None, "conflict", where=where).kind == Kind.TRANSIENT, (status, where)


@pytest.mark.parametrize("family", list(Family))
def test_a_404_stops_the_job_when_it_names_the_model_or_the_endpoint(family):
    for where in Where:
        named = decide(family, 404, None, "The model `x` does not exist", where=where)
        assert named.kind == Kind.SYSTEMIC and named.stop == "model_not_found"
        assert decide(family, 404, None, "Invalid URL (POST /v1/x)", where=where).kind == Kind.SYSTEMIC
    # naming neither: a line's own problem; a call's batch or file is gone (stop)
    assert decide(family, 404, None, "No such File object: file-1", where=Where.LINE).kind == Kind.POISON
    assert decide(family, 404, None, "No such File object: file-1", where=Where.CALL).kind == Kind.SYSTEMIC


def test_an_online_404_always_stops_the_job():
    assert decide(Family.OPENAI, 404, None, '{"detail":"Not Found"}', where=Where.REQUEST).kind == Kind.SYSTEMIC
    # not a job name, an ARN: "model-invocation-job" does not name a model
    arn = "The specified job arn:aws:bedrock:us-east-1:1:model-invocation-job/abc does not exist."
    assert decide(Family.BEDROCK, 404, "ResourceNotFoundException", arn).stop is None


def test_google_already_exists_is_not_the_retried_409():
    assert decide(Family.GEMINI, 409, "already_exists", where=Where.LINE).kind == Kind.POISON
    assert decide(Family.VERTEX, 409, "aborted", where=Where.LINE).kind == Kind.TRANSIENT


# -- where the answer came from ------------------------------------------------------------------------------------
def test_a_queue_refusal_is_a_quota_error_on_create_only():
    full = "Number of requests in the processing queue exceeds the limit. Limit: 100000"
    for family in (Family.OPENAI, Family.ANTHROPIC, Family.GEMINI, Family.VERTEX):
        assert decide(family, 429, None, full, where=Where.CREATE).kind == Kind.QUOTA
        assert decide(family, 429, None, full, where=Where.CALL).kind == Kind.TRANSIENT
        assert decide(family, 429, None, "Rate limit reached for requests", where=Where.CREATE).kind == Kind.TRANSIENT
    assert decide(Family.BEDROCK, 400, "ServiceQuotaExceededException", "", where=Where.CREATE).kind == Kind.QUOTA
    assert decide(Family.BEDROCK, 400, "ServiceQuotaExceededException", "").kind == Kind.TRANSIENT
    # a throttle is never a queue, whatever it says; no credit is a stop, though its message says "quota"
    assert decide(Family.BEDROCK, 429, "ThrottlingException", "quota", where=Where.CREATE).kind == Kind.TRANSIENT
    assert (
        decide(Family.OPENAI, 429, "insufficient_quota", "You exceeded your current quota", where=Where.CREATE).kind
        == Kind.SYSTEMIC
    )


def test_poison_is_per_item_for_a_request_or_a_line_and_stops_a_call():
    assert decide(Family.OPENAI, 400, "context_length_exceeded", where=Where.REQUEST).kind == Kind.POISON
    assert decide(Family.OPENAI, 400, "context_length_exceeded", where=Where.LINE).kind == Kind.POISON
    assert decide(Family.OPENAI, 400, "context_length_exceeded", where=Where.CALL).kind == Kind.SYSTEMIC
    assert decide(Family.BEDROCK, 400, "ValidationException", where=Where.CREATE).kind == Kind.SYSTEMIC


def test_x_should_retry_decides_between_transient_and_poison_never_a_stop():
    assert decide(Family.OPENAI, 500, None, where=Where.REQUEST, should_retry=False).kind == Kind.POISON
    assert decide(Family.OPENAI, 400, None, where=Where.REQUEST, should_retry=True).kind == Kind.TRANSIENT
    assert decide(Family.OPENAI, 401, "invalid_api_key", where=Where.REQUEST, should_retry=True).kind == Kind.SYSTEMIC


def test_one_providers_code_is_never_read_as_anothers():
    """Google's ErrorInfo reason RATE_LIMIT_EXCEEDED is not OpenAI's rate_limit_exceeded: a create refused for
    the project's concurrent jobs waits for room (a QuotaError), it is not retried in place."""
    full = "Quota exceeded for aiplatform.googleapis.com/concurrent_batch_prediction_jobs. Limit: 1"
    for family in (Family.GEMINI, Family.VERTEX):
        assert (
            decide(family, 429, "resource_exhausted", full, reason="RATE_LIMIT_EXCEEDED", where=Where.CREATE).kind
            == Kind.QUOTA
        )
    # OpenAI's own refusal of a create past the batches per hour is a 429 rate_limit_exceeded that names its limit
    per_hour = "Rate limit reached for batch creation: 2 batches were created in the past hour. Limit: 2 batches"
    assert decide(Family.OPENAI, 429, "rate_limit_exceeded", per_hour, where=Where.CREATE).kind == Kind.QUOTA
    assert (
        decide(Family.OPENAI, 429, "rate_limit_exceeded", "Rate limit reached", where=Where.CREATE).kind
        == Kind.TRANSIENT
    )
    assert decide(Family.BEDROCK, 500, "server_error").row.families != et.OPENAI_LIKE


def test_codes_match_case_insensitively_on_the_code_or_the_reason():
    assert decide(Family.GEMINI, 400, "invalid_argument", reason="API_KEY_INVALID").stop == "invalid_api_key"
    assert (
        decide(Family.ANTHROPIC, 429, "rate_limit_error", reason="enforced_spend_limit_reached").kind == Kind.SYSTEMIC
    )
    assert decide(Family.BEDROCK, 409, "conflictexception").kind == Kind.TRANSIENT


# -- lines carry no family: the rows must not disagree across families ----------------------------------------------
@pytest.mark.parametrize(
    "index",
    [i for i, r in enumerate(ROWS) if Where.LINE in r.where],
    ids=lambda i: f"{i}:{ROWS[i].code or ROWS[i].status}",
)
def test_a_line_gets_the_class_its_own_family_would_give(index):
    row = ROWS[index]
    p = probe(row)
    own = [decide(f, p["status"], p["code"], p["message"], where=Where.LINE).kind for f in row.families or Family]
    assert {decide(None, p["status"], p["code"], p["message"], where=Where.LINE).kind} == set(own)


@pytest.mark.parametrize(
    "code,status,message,expected",
    [
        (None, 409, None, ErrorClass.TRANSIENT),  # was poison for lines: settled
        ("aborted", 409, None, ErrorClass.TRANSIENT),
        ("ModelTimeoutException", 408, None, ErrorClass.TRANSIENT),
        ("not_found", 404, "Requested entity was not found.", ErrorClass.POISON),
        ("not_found", 404, "models/gemini-9 is not found", ErrorClass.SYSTEMIC),
        ("permission_denied", 403, None, ErrorClass.SYSTEMIC),
        ("resource_exhausted", 429, "quota exceeded", ErrorClass.TRANSIENT),  # a quota word, but a line
        ("invalid_request_error", 400, "Your credit balance is too low", ErrorClass.SYSTEMIC),
        ("unparseable_line", None, None, ErrorClass.POISON),
    ],
)
def test_line_classes(code, status, message, expected):
    assert classify_line_error(code, status, message) == expected


# -- what the adapters get back --------------------------------------------------------------------------------------
def test_provider_error_builds_each_class_with_the_rows_code_and_advice():
    stop = provider_error(decide(Family.ANTHROPIC, 402, "billing_error"), "Anthropic x failed: HTTP 402", code="b")
    assert isinstance(stop, SystemicError) and stop.code == "credit_balance_too_low"
    assert str(stop).endswith("(the account has no credit left; add credit, then re-run to resume)")
    own = provider_error(decide(Family.BEDROCK, 400, "ValidationException"), "m", code="ValidationException")
    assert isinstance(own, SystemicError) and own.code == "ValidationException" and str(own) == "m"
    refused = provider_error(
        decide(Family.OPENAI, 429, None, "Limit: 5 batches per hour", where=Where.CREATE),
        "m",
        code="c",
        retry_after_s=2.0,
        dimension="per_hour",
        limit=5,
    )
    assert isinstance(refused, QuotaError) and (refused.dimension, refused.limit, refused.retry_after_s) == (
        "per_hour",
        5,
        2.0,
    )
    wait = provider_error(decide(Family.OPENAI, 503, None), "m", code="c", retry_after_s=1.5)
    assert type(wait) is TransientError and wait.retry_after_s == 1.5 and wait.code == "c"


def test_every_stop_code_of_the_table_has_a_troubleshooting_row():
    rows = {t.name for t in TROUBLES if t.kind == TroubleKind.STOP}
    assert et.stop_codes() and et.stop_codes() <= rows, et.stop_codes() - rows
