"""The sandbox's side of Cloud Storage for Vertex jobs: a loopback GCS emulator, reached with google-cloud-storage.

The emulator's URL comes from ``$BATCH_PIPELINE_SANDBOX_GCS_URL`` or, failing that, ``$STORAGE_EMULATOR_HOST``
(what every Google client reads). Without one, the sandbox starts ``gcp-storage-emulator`` itself (in memory, on
a free loopback port, on the first Vertex call; the ``sandbox`` extra) and says where it is at
``GET /_sandbox/gcs``, so that the executor's storage client talks to the same emulator. Only loopback URLs are
used: the sandbox never talks to a real bucket.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from batch_pipeline.sandbox.google.errors import GoogleError

GCS_URL_ENVS = ("BATCH_PIPELINE_SANDBOX_GCS_URL", "STORAGE_EMULATOR_HOST")
LOOPBACK = ("127.0.0.1", "localhost", "::1")


class GcsUnavailable(Exception):
    """The emulator could not be read or written (the job fails with this message)."""


def emulator_url() -> str | None:
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
        self._url: str | None = None
        self._own: Any = None  # the emulator this sandbox started, if it had to
        self._own_url: str | None = None

    def require(self) -> str:
        """The emulator URL: the configured one, else one this sandbox starts (503 when it cannot)."""
        url = emulator_url() or self._start_emulator()
        host = urlsplit(url).hostname or ""
        if host not in LOOPBACK:
            raise GoogleError(400, f"The sandbox uses loopback GCS emulators only, not {url!r}.")
        return url

    def _start_emulator(self) -> str:
        if self._own_url is not None:
            return self._own_url
        try:
            from gcp_storage_emulator.server import create_server
        except ImportError:
            raise GoogleError(
                503,
                "The sandbox has no GCS emulator for Vertex AI batch jobs: install the `sandbox` "
                "extra (pip install 'batch_pipeline[sandbox]'), or start one (`gcp-storage-emulator "
                "start --port N --in-memory`) and run the sandbox with "
                f"${GCS_URL_ENVS[0]}=http://127.0.0.1:N.",
            ) from None
        server = create_server("127.0.0.1", 0, in_memory=True)
        server._api.daemon = True  # the emulator's own thread must not keep the sandbox process alive
        server.start()
        self._own = server
        self._own_url = f"http://127.0.0.1:{server._api._httpd.server_address[1]}"
        return self._own_url

    def stop(self) -> None:
        """Stop the emulator this sandbox started (its objects are in memory and go with it)."""
        if self._own is not None:
            self._own.stop()
            self._own, self._own_url = None, None

    def _storage(self) -> Any:
        url = self.require()
        if self._client is None or self._url != url:
            import google.cloud.storage as storage  # starts fast without them
            from google.auth.credentials import AnonymousCredentials  # imported on first use: the sandbox

            self._client = storage.Client(
                project="sandbox", credentials=AnonymousCredentials(), client_options={"api_endpoint": url}
            )
            self._url = url
        return self._client

    def download(self, uri: str, path: Path) -> None:
        """An object's bytes written to ``path`` (a job's input, streamed to the spool rather than held)."""
        bucket, name = split_gs(uri)
        try:
            self._storage().bucket(bucket).blob(name).download_to_filename(str(path), timeout=30)
        except GoogleError:
            raise
        except Exception as exc:  # the client's NotFound, Forbidden, connection errors ...
            raise GcsUnavailable(f"cannot read {uri}: {type(exc).__name__}: {exc}") from None

    def write_file(self, uri: str, path: Path) -> None:
        """An object from a file, streamed (a job's predictions, not read into memory)."""
        bucket, name = split_gs(uri)
        try:
            blob = self._storage().bucket(bucket).blob(name)
            blob.upload_from_filename(str(path), content_type="application/jsonl", timeout=30)
        except GoogleError:
            raise
        except Exception as exc:
            raise GcsUnavailable(f"cannot write {uri}: {type(exc).__name__}: {exc}") from None
