"""Every expected stop, wait and check failure, what it means and the command that fixes it.

One table: the docs' troubleshooting page (``docs/troubleshooting.md``) is rendered from it (``python -m
batch_pipeline.core.troubleshooting``), and a test compares its rows with the stop codes, wait kinds and checks
the code defines, so neither can drift. ``lookup`` and ``for_stop`` give the CLI the fix for a stop code, wait kind or check.
"""

from dataclasses import dataclass
from enum import StrEnum


class TroubleKind(StrEnum):
    STOP = "job stop"  # a stop record (`status` prints it); `run`/`resume` clears it after the fix
    WAIT = "shard waits"  # the driver's WaitKind, in `status`'s "next" column
    BLOCKING_CHECK = "blocking check"  # nothing is promoted (or submitted) until it passes
    WARNING_CHECK = "warning check"  # flagged in the UI; nothing is held


# a stop whose code a provider chose (an HTTP error type, a google.rpc status): not one of the named codes
OTHER_PROVIDER_CODE = "any other provider code"


@dataclass(frozen=True)
class Trouble:
    kind: TroubleKind
    name: str
    meaning: str
    fix: str


_RESUME = "then `batch-pipeline resume <job>`"

TROUBLES: tuple[Trouble, ...] = (
    # -- job stops: our own codes ------------------------------------------------------------------------
    Trouble(
        TroubleKind.STOP,
        "budget",
        "spent + in flight + the next submission would pass `budget_usd`; nothing more was sent",
        f"raise `budget_usd` in the spec (`batch-pipeline quote <job>` shows what is left), {_RESUME}",
    ),
    Trouble(
        TroubleKind.STOP,
        "retry_cap",
        "resubmitting failed items would take retry spend past "
        "`retries.spend_cap_share` of the first pass: something fails too often to keep paying for",
        f"`batch-pipeline status <job>` shows the failures; fix their cause or raise "
        f"`retries.spend_cap_share`, {_RESUME}",
    ),
    Trouble(
        TroubleKind.STOP,
        "canary_failed",
        "the canary's failure rate passed `canary.max_failure_rate`, or "
        "its golden accuracy fell below `quality.canary_min_accuracy`; only the canary was paid for",
        f"fix the prompt, `max_tokens` or model the stop reason points at, {_RESUME} (the canary runs again)",
    ),
    Trouble(
        TroubleKind.STOP,
        "batch_failed",
        "the provider failed a whole batch (its errors are in the stop "
        "reason): usually a malformed input file or a limit of the account",
        f"`batch-pipeline status <job>` prints the provider's errors; fix the cause, {_RESUME}",
    ),
    Trouble(
        TroubleKind.STOP,
        "engine_failed",
        "the self-hosted vLLM engine crashed (out of GPU memory, a bad model path)",
        f"read the Dagster run log, fix the engine settings in `backend.settings`, {_RESUME}",
    ),
    # -- job stops: the account, key or model is wrong (SYSTEMIC_CODES and the providers' own) -----------
    Trouble(
        TroubleKind.STOP,
        "invalid_api_key",
        "the provider refused the key",
        "export the right key in the "
        f"variable `backend.settings.api_key_env` names (default `OPENAI_API_KEY`), {_RESUME}",
    ),
    Trouble(
        TroubleKind.STOP,
        "invalid_organization",
        "the key belongs to no organization the request may use",
        f"use a key of the right organization, {_RESUME}",
    ),
    Trouble(
        TroubleKind.STOP,
        "account_deactivated",
        "the provider deactivated the account or project",
        f"reactivate it with the provider (or switch `backend`), {_RESUME}",
    ),
    Trouble(
        TroubleKind.STOP,
        "model_not_found",
        "the backend has no model of that name (or the key may not use it)",
        f"fix `model` in the spec, `batch-pipeline quote <job>`, {_RESUME}",
    ),
    Trouble(
        TroubleKind.STOP,
        "insufficient_quota",
        "the account has no credit or quota left (or billing is off on the project)",
        f"add credit or enable billing, {_RESUME}",
    ),
    Trouble(
        TroubleKind.STOP,
        "billing_hard_limit_reached",
        "the account reached its own monthly spend limit",
        f"raise the limit in the provider's billing settings, {_RESUME}",
    ),
    Trouble(
        TroubleKind.STOP,
        "credit_balance_too_low",
        "Anthropic: the account's credit balance is used up",
        f"add credit, {_RESUME}",
    ),
    Trouble(
        TroubleKind.STOP,
        "unsupported_country_region_territory",
        "the provider does not serve the region the request came from",
        f"run from a supported region or pick another `backend`, {_RESUME}",
    ),
    Trouble(
        TroubleKind.STOP,
        "access_denied",
        "Bedrock: no AWS credentials, or the role may not run the job or use the model",
        f"fix the credentials, `role_arn` and model access in the Bedrock console, {_RESUME}",
    ),
    Trouble(
        TroubleKind.STOP,
        "permission_denied",
        "Google: the credentials may not use the project, model or bucket",
        f"grant the IAM roles (or fix the key and project), {_RESUME}",
    ),
    Trouble(
        TroubleKind.STOP,
        "not_found",
        "Google: the Cloud Storage bucket in `backend.settings.bucket` does not exist",
        f"create the bucket or fix `bucket`, {_RESUME}",
    ),
    Trouble(
        TroubleKind.STOP,
        OTHER_PROVIDER_CODE,
        "the provider refused the job with a code of its own (the stop reason quotes its message)",
        f"fix what the message names, {_RESUME}",
    ),
    # -- why a shard waits (status's "next") --------------------------------------------------------------
    Trouble(
        TroubleKind.WAIT,
        "stopped",
        "the job has a stop record (one of the job stops above)",
        "fix the cause the stop names, then `batch-pipeline resume <job>`",
    ),
    Trouble(
        TroubleKind.WAIT,
        "paused",
        "`batch-pipeline pause` holds the job: nothing new is sent, open batches keep running",
        "`batch-pipeline resume <job>`",
    ),
    Trouble(
        TroubleKind.WAIT,
        "in_flight",
        "a run of this shard is queued or running",
        "nothing: it ends on its own (the Dagster UI's runs list shows it)",
    ),
    Trouble(
        TroubleKind.WAIT,
        "batch_open",
        "the provider is still working on the shard's batch",
        "nothing: the shard sensor collects it when it ends, or `batch-pipeline run <job>` waits for it",
    ),
    Trouble(
        TroubleKind.WAIT,
        "canary",
        "every other shard waits until the canary has passed",
        "nothing: `batch-pipeline run <job>` runs the canary first; if it failed, see `canary_failed`",
    ),
    Trouble(
        TroubleKind.WAIT,
        "quote",
        "the quote expired (30 minutes) or no longer matches its inputs",
        "`batch-pipeline quote <job>` (or `batch-pipeline run <job>`, which quotes again)",
    ),
    Trouble(
        TroubleKind.WAIT,
        "below_minimum",
        "fewer items than a batch of the backend needs, and no tail backend",
        "add a `tail:` backend to the spec (it sends such shards online), then `batch-pipeline run <job>`",
    ),
    Trouble(
        TroubleKind.WAIT,
        "quota",
        "the provider account's queue has no room for the shard's batch now "
        "(enqueued tokens or requests, open jobs, creates per hour; the figures are in the reason)",
        "nothing: it is sent when a batch ends; to go faster raise `backend.settings.quota` to the account's "
        "real limit or add `backend.settings.accounts` (docs/quotas.md)",
    ),
    # -- checks ------------------------------------------------------------------------------------------
    Trouble(
        TroubleKind.BLOCKING_CHECK,
        "quote_within_budget",
        "spent + the quote's high estimate passes `budget_usd`: nothing is submitted",
        "raise `budget_usd` (or shrink the input), then `batch-pipeline run <job>`",
    ),
    Trouble(
        TroubleKind.BLOCKING_CHECK,
        "validated_schema",
        "a staged row breaks the pandera schema (its "
        "`failure_cases` metadata lists them): a label outside `output.choice`, a duplicate source line, a "
        "model or prompt version the spec does not name; `validated` keeps the previous table",
        "if the spec changed mid-job, run it again (`batch-pipeline run <job>`); otherwise it is a bug: "
        "report the failure cases",
    ),
    Trouble(
        TroubleKind.BLOCKING_CHECK,
        "outputs_within_contract",
        "an output about to be published fails the "
        "output contract when re-validated from its raw text; `validated` keeps the previous table",
        "a bug in parsing or validation: report it with the check's `violations`",
    ),
    Trouble(
        TroubleKind.BLOCKING_CHECK,
        "no_truncated_outputs",
        "an output about to be published was cut off "
        "at `max_tokens` (`finish_reason` length); `validated` keeps the previous table",
        "`batch-pipeline replay <job> --code truncated --max-tokens N`, then `batch-pipeline run <job>`",
    ),
    Trouble(
        TroubleKind.BLOCKING_CHECK,
        "reconciliation",
        "expected != valid + invalid + missing + dead_lettered "
        "for a shard or the job: an item was lost or counted twice; `validated` keeps the previous table",
        "`batch-pipeline status <job> --check` names the gaps; a bug: report it",
    ),
    Trouble(
        TroubleKind.WARNING_CHECK,
        "shard_distributions",
        "a shard's labels, output lengths or refusal rate "
        "stand out from the other shards (its `per_shard` metadata says which)",
        "inspect that shard's input; nothing is held, `batch-pipeline replay` resends dead letters after a fix",
    ),
)

_BY_NAME = {t.name: t for t in TROUBLES}


def lookup(name: str) -> Trouble | None:
    """The row of a stop code, wait kind or check name."""
    return _BY_NAME.get(name)


def for_stop(code: str | None) -> Trouble:
    """The row of a job stop's code; a code no row names (a provider's own) gets the generic provider row."""
    row = _BY_NAME.get(code or "")
    return row if row is not None and row.kind == TroubleKind.STOP else _BY_NAME[OTHER_PROVIDER_CODE]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_markdown() -> str:
    """The troubleshooting table of docs/troubleshooting.md (pasted between its markers; a test keeps them equal)."""
    lines = ["| shows as | name | what it means | what fixes it |", "|---|---|---|---|"]
    for t in TROUBLES:
        name = t.name if t.name == OTHER_PROVIDER_CODE else f"`{t.name}`"
        lines.append(f"| {t.kind.value} | {name} | {_cell(t.meaning)} | {_cell(t.fix)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render_markdown(), end="")
