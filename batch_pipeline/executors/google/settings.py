"""``backend.settings`` of ``gemini_batch`` and ``vertex_batch``, apart from their executors: the registry reads them
when a code location loads (each job's Dagster pool), and ``google-genai`` costs ~0.5 s to import."""

from pydantic import Field, model_validator

from batch_pipeline.executors.settings import BatchProviderSettings

KEY_ENV, FALLBACK_KEY_ENV = "GEMINI_API_KEY", "GOOGLE_API_KEY"
SANDBOX_BUCKET = "batch-pipeline-sandbox"
DEFAULT_LOCATION = "us-central1"


class GeminiBatchSettings(BatchProviderSettings):
    """``backend.settings`` of ``gemini_batch``. The key is read from ``$GEMINI_API_KEY`` (``$GOOGLE_API_KEY``
    when that is unset), never from the spec. On the sandbox the base URL is ``$BATCH_PIPELINE_SANDBOX_URL``."""

    api_key_env: str | None = KEY_ENV
    api_version: str | None = Field(default=None, description="e.g. v1beta; default: the SDK's (v1)")


class VertexBatchSettings(BatchProviderSettings):
    """``backend.settings`` of ``vertex_batch``. Credentials come from the environment, never from the spec."""

    api_key_env: str | None = Field(default=None, description="unused: Vertex takes application-default credentials")
    project: str | None = Field(default=None, description="default $GOOGLE_CLOUD_PROJECT")
    location: str | None = Field(default=None, description=f"default $GOOGLE_CLOUD_LOCATION, else {DEFAULT_LOCATION}")
    bucket: str | None = Field(
        default=None,
        description=f"the GCS bucket for inputs and predictions (required; {SANDBOX_BUCKET} on the sandbox)",
    )
    prefix: str = Field(default="batch-pipeline", description="object prefix inside the bucket")

    @model_validator(mode="after")
    def _bucket_given(self) -> "VertexBatchSettings":
        if self.bucket is None and not self.sandbox:
            raise ValueError("bucket is required (the GCS bucket Vertex reads inputs from and writes predictions to)")
        if self.bucket is not None and (self.bucket.startswith("gs://") or "/" in self.bucket):
            raise ValueError(f"bucket {self.bucket!r} must be a bare bucket name (no gs://, no path)")
        return self
