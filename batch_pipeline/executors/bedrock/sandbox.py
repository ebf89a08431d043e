"""Where the bundled sandbox keeps its S3 (``GET /_sandbox/bedrock``), for ``sandbox: true``.

The sandbox serves Bedrock's control plane itself and processes jobs against an S3 endpoint of its own (a moto
server, or the one it was given); the executor's ``s3`` client must talk to that same endpoint.
"""

import json
import urllib.error
import urllib.request
from dataclasses import dataclass

from batch_pipeline.core.errors import ConfigError

# fixed, fake credentials: the sandbox accepts any, and real ones must never be sent to it
SANDBOX_CREDENTIALS = {"aws_access_key_id": "sandbox", "aws_secret_access_key": "sandbox-secret"}


@dataclass(frozen=True)
class SandboxS3:
    endpoint_url: str
    bucket: str


def sandbox_s3(sandbox_url: str, timeout_s: float = 30.0) -> SandboxS3:
    try:
        with urllib.request.urlopen(sandbox_url.rstrip("/") + "/_sandbox/bedrock", timeout=timeout_s) as response:
            info = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", "replace")[:500]
        raise ConfigError(f"the sandbox at {sandbox_url} cannot serve Bedrock's S3: {detail}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ConfigError(f"the sandbox at {sandbox_url} did not say where its S3 is: {exc}") from None
    return SandboxS3(info["s3_endpoint_url"], info["bucket"])
