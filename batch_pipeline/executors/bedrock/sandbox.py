"""Where the bundled sandbox keeps its S3 (``GET /_sandbox/bedrock``), for ``sandbox: true``.

The sandbox serves Bedrock's control plane itself and processes jobs against an S3 endpoint of its own (a moto
server, or the one it was given); the executor's ``s3`` client must talk to that same endpoint.
"""

from dataclasses import dataclass

from batch_pipeline.executors.endpoint import sandbox_info

# fixed, fake credentials: the sandbox accepts any, and real ones must never be sent to it
SANDBOX_CREDENTIALS = {"aws_access_key_id": "sandbox", "aws_secret_access_key": "sandbox-secret"}


@dataclass(frozen=True)
class SandboxS3:
    endpoint_url: str
    bucket: str


def sandbox_s3(sandbox_url: str, timeout_s: float = 30.0) -> SandboxS3:
    info = sandbox_info(sandbox_url, "/_sandbox/bedrock", "the S3 behind its Bedrock jobs", timeout_s)
    return SandboxS3(info["s3_endpoint_url"], info["bucket"])
