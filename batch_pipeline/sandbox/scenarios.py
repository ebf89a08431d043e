"""Scenarios: named behaviours with parameters, chosen for the whole server or for one batch."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from batch_pipeline.sandbox.anthropic.errors import AnthropicError
from batch_pipeline.sandbox.errors import ApiError, InjectedError
from batch_pipeline.sandbox.ids import stable_fraction

ENDPOINTS = (
    "upload_file",
    "list_files",
    "retrieve_file",
    "file_content",
    "delete_file",
    "create_batch",
    "list_batches",
    "retrieve_batch",
    "cancel_batch",
    "chat_completions",
    "embeddings",  # POST /v1/embeddings (online)
    # Anthropic Message Batches (served at the root)
    "anthropic_create",
    "anthropic_list",
    "anthropic_retrieve",
    "anthropic_cancel",
    "anthropic_delete",
    "anthropic_results",
    # Amazon Bedrock batch inference (control plane at the root; jobs read and write the sandbox's S3)
    "bedrock_create",
    "bedrock_get",
    "bedrock_list",
    "bedrock_stop",
    # Gemini Developer API (told apart by x-goog-api-key; see sandbox/google/gemini_api.py)
    "gemini_upload",
    "gemini_upload_chunk",
    "gemini_list_files",
    "gemini_get_file",
    "gemini_delete_file",
    "gemini_download",
    "gemini_create",
    "gemini_list",
    "gemini_get",
    "gemini_cancel",
    "gemini_delete",
    # Vertex AI batch prediction (sandbox/google/vertex.py)
    "vertex_create",
    "vertex_list",
    "vertex_get",
    "vertex_cancel",
    "vertex_delete",
)

# Lifecycle durations in clock seconds; every scenario accepts them.
# the line errors a batch output can carry: transient by default, or systemic (a revoked key, no credit)
LINE_ERROR_CODES: dict[str, tuple[int, str, str]] = {
    "server_error": (500, "server_error", "server_error"),
    "invalid_api_key": (401, "invalid_request_error", "invalid_api_key"),
    "insufficient_quota": (429, "insufficient_quota", "insufficient_quota"),
}
COMMON_PARAMS: dict[str, Any] = {"validating_s": 0.05, "in_progress_s": 0.2, "finalizing_s": 0.05, "cancelling_s": 0.05}
# Online rate limits of /v1/chat/completions per sandbox-clock minute; every scenario accepts them.
COMMON_PARAMS.update({"rpm": 1_000_000, "tpm": 1_000_000_000})
# Bedrock's minimum records per batch inference job (the service quota's default); every scenario accepts it.
COMMON_PARAMS["min_records"] = 100
# Account quotas (sandbox/quotas.py), read from the server-wide scenario only; 0 = off. max_records_per_job 0 is
# Bedrock's default maximum (50,000).
QUOTA_PARAMS = (
    "quota_enqueued_tokens",
    "quota_batches_per_hour",
    "quota_enqueued_requests",
    "quota_concurrent_jobs",
    "max_records_per_job",
)
COMMON_PARAMS.update(dict.fromkeys(QUOTA_PARAMS, 0))
# Retention on the sandbox clock (always on): OpenAI/Azure output and error files after the batch ended,
# Anthropic results after the batch was created.
COMMON_PARAMS.update({"retention_openai_s": 30 * 24 * 3600, "retention_anthropic_s": 29 * 24 * 3600})

SCENARIO_PARAMS: dict[str, dict[str, Any]] = {
    "normal": {},
    "line_errors": {"rate": 0.1, "times": 1, "code": "server_error"},
    "expire": {"complete_share": 0.5},
    "partial": {"complete_share": 0.5},  # Vertex: JOB_STATE_PARTIALLY_SUCCEEDED, the rest never run
    "rate_limit": {"times": 3, "retry_after_ms": 50, "on": list(ENDPOINTS)},
    # retry_after_ms > 0: the 500 carries retry-after(-ms), as the rate limit does (a real 500 carries none, and the
    # SDKs then back off on their own: ~0.5 s, then 1 s, ...)
    "server_error": {"times": 1, "on": list(ENDPOINTS), "commit": False, "retry_after_ms": 0},
    "fail_validation": {"lines": [1]},
    "slow": {"in_progress_s": 3.0},
    "unknown_model": {},
    "no_credit": {},
    "access_denied": {},  # Bedrock: every call answers 403 AccessDeniedException
    # any HTTP error on the endpoints in ``on``, in each provider's envelope: ``code`` is OpenAI's error.code, Azure's
    # code, Anthropic's error.details.error_code, Bedrock's exception name, Google's ErrorInfo reason; ``type`` is
    # OpenAI's error.type, Anthropic's error.type, Google's status name (each defaults to the status's own)
    "http_error": {
        "status": 500,
        "code": "",
        "type": "",
        "message": "",
        "times": 1,
        "on": list(ENDPOINTS),
        "retry_after_ms": 0,
    },
    "skew_labels": {"label": "other"},
    "wrong_labels": {"share": 1.0},
}

METADATA_NAME = "sandbox_scenario"
METADATA_PARAMS = "sandbox_params"
METADATA_PARAM_PREFIX = "sandbox_param_"


def _coerce(name: str, value: Any, default: Any) -> Any:
    """Convert ``value`` to the type of ``default`` (metadata values arrive as strings)."""
    if isinstance(value, str) and not isinstance(default, str):
        try:
            value = json.loads(value)
        except ValueError:
            if isinstance(default, list):
                value = [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ValueError(f"param {name} must be a boolean")
        return value
    if isinstance(default, (int, float)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"param {name} must be a number")
        return int(value) if isinstance(default, int) and float(value).is_integer() else float(value)
    if isinstance(default, list):
        if isinstance(value, (str, int)):
            value = [value]
        if not isinstance(value, list):
            raise ValueError(f"param {name} must be a list")
        return value
    return value


@dataclass(frozen=True)
class Scenario:
    """A scenario name with its parameters (defaults filled in)."""

    name: str = "normal"
    params: dict[str, Any] = field(default_factory=dict)

    def param(self, key: str) -> Any:
        """A parameter value (with its default)."""
        return self.params[key]

    def line_error_due(self, key: str, sightings: int) -> bool:
        """``line_errors``: the request ``key`` (a stable ``rate`` share of all keys) fails while it has been seen
        fewer than ``times`` times before."""
        return (
            self.name == "line_errors"
            and stable_fraction("line_errors", key) < float(self.param("rate"))
            and sightings < int(self.param("times"))
        )

    def line_error(self) -> tuple[int, str, str]:
        """``line_errors``: the (HTTP status, error type, code) of a failed line; ``code`` chooses it."""
        code = str(self.params.get("code", "server_error"))
        return LINE_ERROR_CODES.get(code, (500, "server_error", code))

    def to_json(self) -> dict[str, Any]:
        """``{"name", "params"}``."""
        return {"name": self.name, "params": dict(self.params)}


def make_scenario(name: str | None, params: dict[str, Any] | None = None) -> Scenario:
    """Validate a scenario; raises ValueError for an unknown name or parameter or a bad value."""
    name = name or "normal"
    if name not in SCENARIO_PARAMS:
        raise ValueError(f"unknown scenario {name!r}; known: {', '.join(SCENARIO_PARAMS)}")
    defaults = {**COMMON_PARAMS, **SCENARIO_PARAMS[name]}
    given = dict(params or {})
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise ValueError(f"unknown params for scenario {name}: {unknown}; known: {sorted(defaults)}")
    merged = {key: _coerce(key, given[key], default) if key in given else default for key, default in defaults.items()}
    for key in ("rate", "complete_share"):
        if key in merged and not 0.0 <= merged[key] <= 1.0:
            raise ValueError(f"param {key} must lie in [0, 1]")
    for key, value in merged.items():
        if key.endswith("_s") and value < 0:
            raise ValueError(f"param {key} must be >= 0")
        if key in ("rpm", "tpm") and value < 1:
            raise ValueError(f"param {key} must be >= 1")
        if key in QUOTA_PARAMS and (value < 0 or not float(value).is_integer()):
            raise ValueError(f"param {key} must be a whole number >= 0 (0: off)")
    if name == "http_error" and not 400 <= merged["status"] <= 599:
        raise ValueError("param status must be an HTTP error status (400-599)")
    bad_endpoints = sorted(set(merged.get("on", [])) - set(ENDPOINTS) - {"*"})
    if bad_endpoints:
        raise ValueError(f"unknown endpoints in 'on': {bad_endpoints}; known: {list(ENDPOINTS)}")
    return Scenario(name, merged)


def scenario_from_metadata(metadata: dict[str, str] | None) -> Scenario | None:
    """The per-batch scenario named by batch metadata, or None.

    ``sandbox_scenario`` names it; parameters come from ``sandbox_params`` (a JSON object string) and/or
    ``sandbox_param_<name>`` keys (JSON-decoded when possible; lists may also be comma-separated).
    """
    if not metadata or METADATA_NAME not in metadata:
        return None
    params: dict[str, Any] = {}
    if METADATA_PARAMS in metadata:
        decoded = json.loads(metadata[METADATA_PARAMS])
        if not isinstance(decoded, dict):
            raise ValueError(f"metadata {METADATA_PARAMS} must be a JSON object")
        params.update(decoded)
    for key, value in metadata.items():
        if key.startswith(METADATA_PARAM_PREFIX):
            params[key[len(METADATA_PARAM_PREFIX) :]] = value
    return make_scenario(metadata[METADATA_NAME], params)


def endpoint_fault(scenario: Scenario, endpoint: str, counts: dict[str, int], scope: str) -> ApiError | None:
    """The injected 429/500 for this call, if the scenario still owes one (counts are updated)."""
    if scenario.name not in ("rate_limit", "server_error", "http_error"):
        return None
    targets = scenario.param("on")
    if endpoint not in targets and "*" not in targets:
        return None
    key = f"{scope}|{scenario.name}|{endpoint}"
    seen = counts.get(key, 0)
    if seen >= int(scenario.param("times")):
        return None
    counts[key] = seen + 1
    if scenario.name == "http_error":
        return http_error(scenario)
    if scenario.name == "server_error":
        return ApiError(
            500,
            "The server had an error while processing your request (sandbox scenario server_error).",
            type="server_error",
            headers=retry_after_headers(int(scenario.param("retry_after_ms"))),
        )
    delay_ms = int(scenario.param("retry_after_ms"))
    return ApiError(
        429,
        f"Rate limit reached for requests (sandbox scenario rate_limit). Please try again in {delay_ms}ms.",
        type="requests",
        code="rate_limit_exceeded",
        headers=_retry_after(delay_ms),  # sent even at 0 ms, as a provider's 429 always says when to retry
    )


def _retry_after(delay_ms: int) -> dict[str, str]:
    """``retry-after-ms``, and ``retry-after`` in whole seconds (at least 1)."""
    return {"retry-after-ms": str(delay_ms), "retry-after": str(max(1, math.ceil(delay_ms / 1000)))}


def retry_after_headers(delay_ms: int) -> dict[str, str]:
    """The retry-after headers for a delay > 0; none otherwise."""
    return _retry_after(delay_ms) if delay_ms > 0 else {}


def http_error(scenario: Scenario) -> InjectedError:
    """The ``http_error`` scenario's answer (a ``retry-after-ms`` and ``retry-after`` when ``retry_after_ms`` > 0)."""
    status, delay_ms = int(scenario.param("status")), int(scenario.param("retry_after_ms"))
    headers = retry_after_headers(delay_ms)
    message = str(scenario.param("message")) or f"Injected HTTP {status} (sandbox scenario http_error)."
    return InjectedError(
        status,
        message,
        type=str(scenario.param("type")) or None,
        code=str(scenario.param("code")) or None,
        headers=headers,
    )


UNKNOWN_MODEL_PREFIX = "unknown-"
NO_CREDIT_ANTHROPIC = (
    "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to "
    "upgrade or purchase credits."
)
NO_CREDIT_OPENAI = (
    "You exceeded your current quota, please check your plan and billing details. For more "
    "information on this error, read the docs: https://platform.openai.com/docs/guides/error-codes."
)


def account_fault(scenario: Scenario, models: list[str | None], provider: str = "openai") -> ApiError | None:
    """The error a paid call gets for an unknown model or an empty account, if any.

    ``unknown_model`` (or a requested model named ``unknown-*``): 404 (OpenAI code ``model_not_found``,
    Anthropic ``not_found_error``). ``no_credit``: OpenAI 429 ``insufficient_quota`` with ``x-should-retry:
    false``; Anthropic 400 ``invalid_request_error`` "Your credit balance is too low ...".
    """
    unknown = next((m for m in models if isinstance(m, str) and m.startswith(UNKNOWN_MODEL_PREFIX)), None)
    if unknown is None and scenario.name == "unknown_model":
        unknown = next((m for m in models if m), "the requested model")
    if unknown is not None:
        if provider == "anthropic":
            return AnthropicError(404, f"model: {unknown}", type="not_found_error")
        return ApiError(
            404, f"The model `{unknown}` does not exist or you do not have access to it.", code="model_not_found"
        )
    if scenario.name == "no_credit":
        if provider == "anthropic":
            return AnthropicError(400, NO_CREDIT_ANTHROPIC, type="invalid_request_error")
        return ApiError(
            429,
            NO_CREDIT_OPENAI,
            type="insufficient_quota",
            code="insufficient_quota",
            headers={"x-should-retry": "false"},
        )
    return None
