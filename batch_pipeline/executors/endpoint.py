"""Where a backend is and which key it uses: the real provider, a configured base URL, or the sandbox.

Keys come only from the environment (the variable the spec names); the sandbox needs none.
"""

import json
import os
import urllib.error
import urllib.request
from typing import Any

from batch_pipeline.core.errors import ConfigError

SANDBOX_URL_ENV = "BATCH_PIPELINE_SANDBOX_URL"
SANDBOX_KEY = "sk-sandbox"


def resolve_endpoint(
    backend: str,
    *,
    sandbox: bool,
    base_url: str | None,
    api_key_env: str | None,
    sandbox_path: str = "",
    key_required: bool = True,
) -> tuple[str | None, str | None]:
    """(base URL, API key) for a backend; a clear ConfigError when something needed is missing."""
    api_key = os.environ.get(api_key_env) if api_key_env else None
    if sandbox:
        url = os.environ.get(SANDBOX_URL_ENV)
        if not url:
            raise ConfigError(
                f"backend {backend} has sandbox: true but ${SANDBOX_URL_ENV} is not set; start one with "
                "`batch-pipeline sandbox` (or use `batch-pipeline run` / `batch-pipeline dev`, which start it)"
            )
        return url.rstrip("/") + sandbox_path, api_key or SANDBOX_KEY
    if key_required and not api_key:
        raise ConfigError(f"backend {backend} needs an API key in ${api_key_env}")
    return base_url, api_key


def sandbox_info(sandbox_url: str, path: str, what: str, timeout_s: float = 30.0) -> dict[str, Any]:
    """What the sandbox says about a service it runs beside its APIs (``GET /_sandbox/...``): where the object
    store behind its Bedrock or Vertex jobs is, so the executor's own storage client talks to the same one."""
    try:
        with urllib.request.urlopen(sandbox_url.rstrip("/") + path, timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", "replace")[:500]
        raise ConfigError(f"the sandbox at {sandbox_url} cannot serve {what}: {detail}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ConfigError(f"the sandbox at {sandbox_url} did not say where {what} is ({path}): {exc}") from None
