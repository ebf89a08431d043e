"""Azure OpenAI's shape of the Files and Batches endpoints: the same handlers under ``/openai``, an
``api-version`` query on every call, ``api-key`` (or an Entra ID ``Authorization: Bearer``) and the relative
batch endpoint ``/chat/completions``. Request lines carry a deployment name in ``body.model``; the sandbox
serves any deployment name as the model it names."""

from __future__ import annotations

import re

from batch_pipeline.sandbox.errors import ApiError
from batch_pipeline.sandbox.openai.api import BAD_KEY, OpenAIApi
from batch_pipeline.sandbox.openai.validation import AZURE_CHAT_URL
from batch_pipeline.sandbox.routing import Request
from batch_pipeline.sandbox.state import SandboxState

AZURE_PREFIX = "/openai"
# Files + Batches exist from 2024-07-01-preview on (GA 2024-10-21); the format is the service's own
_API_VERSION = re.compile(r"^(\d{4}-\d{2}-\d{2})(-preview)?$")
FIRST_BATCH_VERSION = "2024-07-01"
DENIED = (
    "Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a valid key "
    "for an active subscription and use a correct regional API endpoint for your resource."
)


def azure_api(state: SandboxState) -> OpenAIApi:
    """The OpenAI handlers, served under ``/openai`` with Azure's batch endpoint."""
    return OpenAIApi(state, prefix=AZURE_PREFIX, chat_url=AZURE_CHAT_URL)


def is_azure_path(path: str) -> bool:
    return path.startswith(AZURE_PREFIX + "/")


def check_azure_auth(request: Request) -> None:
    """404 without a known ``api-version`` (as the service answers); 401 without ``api-key`` or a bearer
    token, and for the key (or token) ``sk-sandbox-bad``."""
    version = request.query.get("api-version", "")
    found = _API_VERSION.match(version)
    if found is None or found.group(1) < FIRST_BATCH_VERSION:
        raise ApiError(404, "Resource not found", code="404")
    key = request.presented_key("api-key")
    if not key:
        raise ApiError(
            401,
            "Missing credentials: send an 'api-key' header or 'Authorization: Bearer TOKEN' (any value works here).",
            code="401",
        )
    if key == BAD_KEY:
        raise ApiError(401, DENIED, code="401")
