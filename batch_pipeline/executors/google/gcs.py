"""Cloud Storage for the Vertex AI batch backend, through the real ``google-cloud-storage`` client.

Vertex batch prediction reads its input from GCS and writes its predictions there, so the executor writes one
JSONL object per attempt and reads the job's output directory back. Where the objects live is decided here
once (``AttemptObjects``). Credentials are the environment's: Google application-default credentials, or, when
``STORAGE_EMULATOR_HOST`` is set (the loopback emulator in tests and sandbox runs), anonymous ones, which the
client picks by itself. Errors become our classes (``translate_gcs``) with the bucket named and no token shown.
"""

import fnmatch
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import google.cloud.storage as storage
from google.api_core import exceptions as gexc
from google.auth import exceptions as auth_exc
from google.auth.credentials import AnonymousCredentials

from batch_pipeline.core.errors import BatchPipelineError, ConfigError, SystemicError, TransientError
from batch_pipeline.executors.endpoint import sandbox_info

EMULATOR_ENV = "STORAGE_EMULATOR_HOST"


def sandbox_emulator_url(sandbox_url: str, timeout_s: float) -> str:
    """The loopback GCS emulator for ``sandbox: true``: ``$STORAGE_EMULATOR_HOST`` when set, else the one the
    sandbox runs behind its Vertex jobs (``GET /_sandbox/gcs``, started on first ask)."""
    given = os.environ.get(EMULATOR_ENV, "").strip()
    if given:
        return given if "://" in given else f"http://{given}"
    return str(
        sandbox_info(sandbox_url, "/_sandbox/gcs", "the GCS emulator behind its Vertex jobs", timeout_s)[
            "gcs_endpoint_url"
        ]
    )


PREDICTIONS_GLOB = "predictions*.jsonl"
CHUNK_BYTES = 8 * 2**20


def parse_gs_uri(uri: str) -> tuple[str, str]:
    """``gs://bucket/some/name`` -> (bucket, name); a ConfigError for anything else."""
    if not uri.startswith("gs://"):
        raise ConfigError(f"{uri!r} is not a gs:// URI")
    bucket, _, name = uri[5:].partition("/")
    if not bucket:
        raise ConfigError(f"{uri!r} names no bucket")
    return bucket, name


@dataclass(frozen=True)
class AttemptObjects:
    """Where one attempt's input object and output prefix live: ``gs://BUCKET/PREFIX/JOB/SHARD/ATTEMPT-NONCE/``.

    The nonce keeps two stores that run a job of the same name under one prefix from overwriting each other's
    input before Vertex has read it."""

    bucket: str
    input_name: str
    output_prefix: str

    @classmethod
    def for_key(cls, bucket: str, prefix: str, key: str) -> "AttemptObjects":
        job, shard, attempt = key.rsplit(":", 2)
        base = "/".join(p for p in (prefix.strip("/"), job, shard, f"{attempt}-{uuid.uuid4().hex[:8]}") if p)
        return cls(bucket, f"{base}/input.jsonl", f"{base}/output/")

    @property
    def input_uri(self) -> str:
        return f"gs://{self.bucket}/{self.input_name}"

    @property
    def output_uri(self) -> str:
        return f"gs://{self.bucket}/{self.output_prefix}"


def translate_gcs(exc: Exception, action: str) -> BatchPipelineError:
    """A google-cloud-storage failure -> our error class (the client's own retries were spent)."""
    detail = getattr(exc, "message", None) or str(exc)
    msg = f"GCS {action} failed: {type(exc).__name__}: {detail}"
    if isinstance(exc, gexc.Unauthorized | gexc.Forbidden | auth_exc.DefaultCredentialsError | auth_exc.RefreshError):
        return SystemicError(
            msg + " (check the Google credentials and their access to the bucket)", code="permission_denied"
        )
    if isinstance(exc, gexc.NotFound):
        return SystemicError(msg + " (does the bucket exist?)", code="not_found")
    if isinstance(exc, gexc.TooManyRequests | gexc.ServerError | auth_exc.TransportError | OSError):
        # OSError: requests' connection errors and timeouts, which the storage client lets through
        return TransientError(msg)
    if isinstance(exc, gexc.GoogleAPICallError):
        return SystemicError(msg)
    return BatchPipelineError(msg)


_ERRORS = (gexc.GoogleAPICallError, auth_exc.GoogleAuthError, OSError)


class Gcs:
    """The few object operations the backend needs."""

    def __init__(self, project: str | None, *, emulator_url: str | None, timeout_s: float):
        """``emulator_url``: the sandbox's loopback emulator (anonymous access); None: the real service (ADC)."""
        self.timeout_s = timeout_s
        try:
            if emulator_url is None:
                self.client = storage.Client(project=project)
            else:
                self.client = storage.Client(
                    project=project, credentials=AnonymousCredentials(), client_options={"api_endpoint": emulator_url}
                )
        except _ERRORS as exc:
            raise translate_gcs(exc, "client setup") from None

    def ensure_bucket(self, bucket: str) -> None:
        """Create ``bucket`` if it is missing: for the loopback emulator only (a real bucket is the user's)."""
        try:
            if self.client.lookup_bucket(bucket, timeout=self.timeout_s) is None:
                self.client.create_bucket(bucket, timeout=self.timeout_s)
        except gexc.Conflict:  # created meanwhile by another run
            pass
        except _ERRORS as exc:
            raise translate_gcs(exc, f"creating bucket {bucket}") from None

    def upload(self, bucket: str, name: str, data: bytes) -> None:
        try:
            blob = self.client.bucket(bucket).blob(name)
            blob.upload_from_string(data, content_type="application/jsonl", timeout=self.timeout_s)
        except _ERRORS as exc:
            raise translate_gcs(exc, f"upload of gs://{bucket}/{name}") from None

    def list_names(self, bucket: str, prefix: str, pattern: str = PREDICTIONS_GLOB) -> list[str]:
        """Object names under ``prefix`` whose last segment matches ``pattern``, sorted."""
        try:
            names = [b.name for b in self.client.list_blobs(bucket, prefix=prefix, timeout=self.timeout_s)]
        except _ERRORS as exc:
            raise translate_gcs(exc, f"listing gs://{bucket}/{prefix}") from None
        return sorted(n for n in names if fnmatch.fnmatch(n.rsplit("/", 1)[-1], pattern))

    def delete(self, bucket: str, name: str) -> None:
        """Delete one object; one that is not there counts as deleted (an earlier try got to it)."""
        try:
            self.client.bucket(bucket).blob(name).delete(timeout=self.timeout_s)
        except gexc.NotFound:
            pass
        except _ERRORS as exc:
            raise translate_gcs(exc, f"delete of gs://{bucket}/{name}") from None

    def read(self, bucket: str, name: str) -> bytes:
        try:
            return bytes(self.client.bucket(bucket).blob(name).download_as_bytes(timeout=self.timeout_s))
        except _ERRORS as exc:
            raise translate_gcs(exc, f"download of gs://{bucket}/{name}") from None

    def stream(self, bucket: str, name: str, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
        """An object's bytes in chunks (a broken download is a TransientError: the runner fetches again)."""
        try:
            with self.client.bucket(bucket).blob(name).open("rb", chunk_size=chunk_bytes) as handle:
                while chunk := handle.read(chunk_bytes):
                    yield chunk
        except _ERRORS as exc:
            raise translate_gcs(exc, f"download of gs://{bucket}/{name}") from None
