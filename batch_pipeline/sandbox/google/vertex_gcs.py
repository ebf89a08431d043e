"""The sandbox's side of Cloud Storage for Vertex jobs: a loopback GCS emulator, reached with google-cloud-storage.

The emulator's URL comes from ``$BATCH_PIPELINE_SANDBOX_GCS_URL`` or, failing that, ``$STORAGE_EMULATOR_HOST``
(what every Google client reads). Without one, creating a Vertex job is refused with a message that says so.
Only loopback URLs are used: the sandbox never talks to a real bucket.
"""

from __future__ import annotations

import os
from typing import Any, Optional
from urllib.parse import urlsplit

from batch_pipeline.sandbox.google.errors import GoogleError

GCS_URL_ENVS = ("BATCH_PIPELINE_SANDBOX_GCS_URL", "STORAGE_EMULATOR_HOST")
LOOPBACK = ("127.0.0.1", "localhost", "::1")


class GcsUnavailable(Exception):
    """The emulator could not be read or written (the job fails with this message)."""


def emulator_url() -> Optional[str]:
    """The configured emulator URL, or None."""
    for name in GCS_URL_ENVS:
        value = os.environ.get(name, "").strip()
        if value:
            return value if "://" in value else f"http://{value}"
    return None


def split_gs(uri: str) -> tuple[str, str]:
    """``gs://bucket/name`` -> (bucket, name)."""
    if not uri.startswith("gs://") or "/" not in uri[5:]:
        raise GoogleError(400, f"{uri!r} is not a gs://bucket/object URI.")
    bucket, _, name = uri[5:].partition("/")
    return bucket, name


class SandboxGcs:
    """Reads inputs and writes predictions on the emulator (one storage client, made on first use)."""

    def __init__(self) -> None:
        self._client: Any = None
        self._url: Optional[str] = None

    def require(self) -> str:
        """The emulator URL; a 400 ``FAILED_PRECONDITION``-style error when none is configured."""
        url = emulator_url()
        if url is None:
            raise GoogleError(400, "The sandbox has no GCS emulator for Vertex AI batch jobs: start one (e.g. "
                                   "`gcp-storage-emulator start --port N --in-memory`) and run the sandbox with "
                                   f"${GCS_URL_ENVS[0]} or ${GCS_URL_ENVS[1]}=http://127.0.0.1:N.")
        host = urlsplit(url).hostname or ""
        if host not in LOOPBACK:
            raise GoogleError(400, f"The sandbox uses loopback GCS emulators only, not {url!r}.")
        return url

    def _storage(self) -> Any:
        url = self.require()
        if self._client is None or self._url != url:
            from google.auth.credentials import AnonymousCredentials  # imported on first use: the sandbox
            from google.cloud import storage                           # starts fast without them

            self._client = storage.Client(project="sandbox", credentials=AnonymousCredentials(),
                                          client_options={"api_endpoint": url})
            self._url = url
        return self._client

    def read(self, uri: str) -> bytes:
        bucket, name = split_gs(uri)
        try:
            return bytes(self._storage().bucket(bucket).blob(name).download_as_bytes(timeout=30))
        except GoogleError:
            raise
        except Exception as exc:  # the client's NotFound, Forbidden, connection errors ...
            raise GcsUnavailable(f"cannot read {uri}: {type(exc).__name__}: {exc}") from None

    def write(self, uri: str, data: bytes) -> None:
        bucket, name = split_gs(uri)
        try:
            blob = self._storage().bucket(bucket).blob(name)
            blob.upload_from_string(data, content_type="application/jsonl", timeout=30)
        except GoogleError:
            raise
        except Exception as exc:
            raise GcsUnavailable(f"cannot write {uri}: {type(exc).__name__}: {exc}") from None
