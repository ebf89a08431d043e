"""OpenAI and Azure account quotas and retention, over the shared ``LoadBook`` (``sandbox/quotas.py``).

- ``quota_enqueued_tokens``: prompt tokens per (account, model) over the batches validating, in progress or
  finalizing. A create is always accepted; a batch that would pass the cap is decided at create (every batch is
  brought up to the clock first) and fails at the end of its validation with ``token_limit_exceeded``: it holds no
  load and bills nothing.
- ``quota_batches_per_hour``: batch creates per account in a rolling sandbox-clock hour; over it a create is a 429
  ``rate_limit_exceeded`` with ``retry-after``.
- ``retention_openai_s``: output and error files are deleted that long after their batch ended.
"""

from __future__ import annotations

import json
from typing import Any

from batch_pipeline.sandbox.batches import BatchRecord
from batch_pipeline.sandbox.errors import ApiError
from batch_pipeline.sandbox.openai.spooled_requests import prompt_token_total
from batch_pipeline.sandbox.openai.validation import AZURE_CHAT_URL
from batch_pipeline.sandbox.quotas import HOUR_S, Load, LoadBook, quota, retry_after_s
from batch_pipeline.sandbox.scenarios import Scenario

ORGANIZATION = "org-sandbox"
OUTPUT_PURPOSE = "batch_output"


def load_provider(endpoint: str) -> str:
    """The load ledger's provider of a batch endpoint."""
    return "azure" if endpoint == AZURE_CHAT_URL else "openai"


def first_model(data: bytes) -> str:
    """``body.model`` of the first line of an input file ('' when it has none): what a refused create names."""
    start = 0
    while start < len(data):
        end = data.find(b"\n", start)
        end = len(data) if end < 0 else end
        line, start = data[start:end], end + 1
        if line.strip():
            try:
                model = json.loads(line)["body"]["model"]
            except (ValueError, KeyError, TypeError):
                return ""
            return model if isinstance(model, str) else ""
    return ""


def _clock_span(seconds: float) -> str:
    """A wait as OpenAI writes it: ``12m30s``, ``45s``."""
    minutes, secs = divmod(max(int(seconds + 0.999), 1), 60)
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


def check_create_rate(
    book: LoadBook, scenario: Scenario, provider: str, account: str, model: str, now: float, scale: float
) -> None:
    """429 when the account created ``quota_batches_per_hour`` batches in the past rolling hour."""
    cap = quota(scenario, "quota_batches_per_hour")
    if not cap:
        return
    recent = book.creates_within_hour(provider, account, now)
    if len(recent) < cap:
        return
    wait = recent[0] + HOUR_S - now
    book.refuse(provider, "", account, [model], now)
    raise ApiError(
        429,
        f"Rate limit reached for batch creation in organization {ORGANIZATION}: {len(recent):,} "
        f"batches were created in the past hour. Limit: {cap:,} batches per hour. Please try again "
        f"in {_clock_span(wait)}.",
        type="rate_limit_exceeded",
        code="rate_limit_exceeded",
        headers={"retry-after": str(retry_after_s(wait, scale, cap=None))},
    )


def token_limit_error(model: str, cap: int) -> dict[str, Any]:
    """The ``errors.data`` entry of a batch refused for enqueued tokens (OpenAI's wording and commas)."""
    return {
        "code": "token_limit_exceeded",
        "message": f"Enqueued token limit reached for {model} in organization {ORGANIZATION}. Limit: {cap:,} "
        "enqueued tokens. Please try again once some in_progress batches have been completed.",
        "param": None,
        "line": None,
    }


def admit(book: LoadBook, scenario: Scenario, batch: BatchRecord, account: str) -> None:
    """At create, for a batch whose input passed its checks (tokens counted): hold its prompt tokens, or doom it
    to fail validation with ``token_limit_exceeded`` when they would pass the server's cap."""
    tokens = prompt_token_total(batch.requests)
    provider, model = load_provider(batch.endpoint), batch.model or ""
    cap = quota(scenario, "quota_enqueued_tokens")
    if cap and book.enqueued(provider, account, model).tokens + tokens > cap:
        batch.validation_errors = [token_limit_error(model, cap)]
        book.refuse(provider, batch.id, account, [model], batch.created_at)
        return
    book.hold(provider, batch.id, account, {model: Load(tokens, len(batch.requests), 1)}, batch.created_at)


def output_expired(scenario: Scenario, purpose: str, created_at: float, now: float) -> bool:
    """True for an output or error file past ``retention_openai_s`` (its ``created_at`` is the batch's end)."""
    return purpose == OUTPUT_PURPOSE and now >= created_at + float(scenario.param("retention_openai_s"))


def output_expires_at(scenario: Scenario, purpose: str, created_at: float, default_s: float) -> int:
    """A file's ``expires_at``: output files by ``retention_openai_s``, the others ``default_s`` after upload."""
    keep = float(scenario.param("retention_openai_s")) if purpose == OUTPUT_PURPOSE else default_s
    return int(created_at + keep)
