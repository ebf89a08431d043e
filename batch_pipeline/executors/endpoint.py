"""Where a backend is and which key it uses: the real provider, a configured base URL, or the sandbox.

Keys come only from the environment (the variable the spec names); the sandbox needs none.
"""

import os

from batch_pipeline.core.errors import ConfigError

SANDBOX_URL_ENV = "BATCH_PIPELINE_SANDBOX_URL"
SANDBOX_KEY = "sk-sandbox"


def resolve_endpoint(backend: str, *, sandbox: bool, base_url: str | None, api_key_env: str | None,
                     sandbox_path: str = "", key_required: bool = True) -> tuple[str | None, str | None]:
    """(base URL, API key) for a backend; a clear ConfigError when something needed is missing."""
    api_key = os.environ.get(api_key_env) if api_key_env else None
    if sandbox:
        url = os.environ.get(SANDBOX_URL_ENV)
        if not url:
            raise ConfigError(
                f"backend {backend} has sandbox: true but ${SANDBOX_URL_ENV} is not set; start one with "
                "`batch-pipeline sandbox` (or use `batch-pipeline run` / `batch-pipeline dev`, which start it)")
        return url.rstrip("/") + sandbox_path, api_key or SANDBOX_KEY
    if key_required and not api_key:
        raise ConfigError(f"backend {backend} needs an API key in ${api_key_env}")
    return base_url, api_key
