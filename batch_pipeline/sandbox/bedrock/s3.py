"""The object store behind the sandbox's Bedrock jobs: a moto S3 server it starts on a free loopback port, or the
S3 endpoint named by ``$BATCH_PIPELINE_SANDBOX_S3_URL`` (``--s3-url``).

Bedrock batch jobs read their input from S3 and write their output there, so the sandbox needs a real S3 that the
client's ``boto3.client("s3")`` can reach too. moto's server is started lazily, on the first Bedrock call, so a
sandbox that only serves OpenAI or Anthropic never imports it (moto[server] is the ``sandbox`` extra).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

S3_URL_ENV = "BATCH_PIPELINE_SANDBOX_S3_URL"
DEFAULT_BUCKET = "batch-pipeline-sandbox"
REGION = "us-east-1"
# the sandbox's own S3 calls sign with these; moto (and the sandbox) accept any credentials
SANDBOX_ACCESS_KEY = "sandbox"
SANDBOX_SECRET_KEY = "sandbox-secret"
MISSING_MOTO = (
    "the sandbox's Bedrock API needs moto[server] to serve S3: install the `sandbox` extra "
    f"(pip install 'batch_pipeline[sandbox]'), or point ${S3_URL_ENV} at an S3 endpoint"
)


class S3Unavailable(RuntimeError):
    """No S3 to process Bedrock jobs against (moto missing and no endpoint given)."""


def split_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/key/prefix`` -> (bucket, key); ValueError for anything else."""
    parts = urlsplit(uri)
    if parts.scheme != "s3" or not parts.netloc:
        raise ValueError(f"{uri!r} is not an s3://bucket/key URI")
    return parts.netloc, parts.path.lstrip("/")


class SandboxS3:
    """Reads and writes objects on the sandbox's S3 (started on first use; stopped with ``stop``)."""

    def __init__(self, url: str | None = None) -> None:
        self.given_url = url or os.environ.get(S3_URL_ENV) or None
        self._server: Any = None
        self._client: Any = None
        self._url: str | None = None

    @property
    def url(self) -> str:
        """The S3 endpoint URL, starting moto's server the first time it is asked for."""
        if self._url is None:
            self._url = self.given_url.rstrip("/") if self.given_url else self._start_moto()
            self._ensure_bucket(DEFAULT_BUCKET)
        return self._url

    def _start_moto(self) -> str:
        try:
            from moto.server import ThreadedMotoServer
        except ImportError:
            raise S3Unavailable(MISSING_MOTO) from None
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per S3 request on stderr
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        self._server = server
        host, port = server.get_host_and_port()
        return f"http://{host}:{port}"

    @property
    def client(self) -> Any:
        if self._client is None:
            import boto3
            from botocore.config import Config

            self._client = boto3.client(
                "s3",
                endpoint_url=self.url,
                region_name=REGION,
                aws_access_key_id=SANDBOX_ACCESS_KEY,
                aws_secret_access_key=SANDBOX_SECRET_KEY,
                config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3, "mode": "standard"}),
            )
        return self._client

    def _ensure_bucket(self, bucket: str) -> None:
        from botocore.exceptions import ClientError

        try:
            self.client.head_bucket(Bucket=bucket)
        except ClientError:
            self.client.create_bucket(Bucket=bucket)

    def read(self, bucket: str, key: str) -> bytes:
        """An object's bytes; KeyError when it does not exist."""
        from botocore.exceptions import ClientError

        try:
            return bytes(self.client.get_object(Bucket=bucket, Key=key)["Body"].read())
        except ClientError as exc:
            raise KeyError(f"s3://{bucket}/{key}: {exc.response.get('Error', {}).get('Code')}") from None

    def keys(self, bucket: str, prefix: str) -> list[str]:
        """Every key under ``prefix``, sorted; KeyError for a missing bucket."""
        from botocore.exceptions import ClientError

        out: list[str] = []
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
                out.extend(item["Key"] for item in page.get("Contents") or [])
        except ClientError as exc:
            raise KeyError(f"s3://{bucket}/{prefix}: {exc.response.get('Error', {}).get('Code')}") from None
        return sorted(out)

    def write(self, bucket: str, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=bucket, Key=key, Body=data)

    def write_file(self, bucket: str, key: str, path: Path) -> None:
        """An object from a file, streamed (a job's output, not read into memory)."""
        with path.open("rb") as body:
            self.client.put_object(Bucket=bucket, Key=key, Body=body)

    def stop(self) -> None:
        """Stop moto's server if this sandbox started it."""
        if self._server is not None:
            self._server.stop()
            self._server = None
