"""``backend.settings`` of ``bedrock_batch``: the role Bedrock assumes, where input and output live in S3, the
region, and the job's minimum record count. Credentials come only from the standard AWS chain (environment,
profile, instance or pod role), never from the spec.
"""

from dataclasses import dataclass
from typing import Self

from pydantic import Field, model_validator

from batch_pipeline.executors.settings import BatchProviderSettings

SANDBOX_ROLE_ARN = "arn:aws:iam::123456789012:role/batch-pipeline-sandbox"
DEFAULT_MIN_RECORDS = 100  # Bedrock's "minimum number of records per batch inference job" quota, by default


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str  # no leading or trailing slash; may be empty

    def key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    def uri(self, *parts: str) -> str:
        return f"s3://{self.bucket}/{self.key(*parts)}"


def _split(uri: str) -> S3Location:
    if not uri.startswith("s3://") or len(uri) <= 5:
        raise ValueError(f"{uri!r} is not an s3://bucket/prefix URI")
    bucket, _, prefix = uri[5:].partition("/")
    return S3Location(bucket, prefix.strip("/"))


class BedrockBatchSettings(BatchProviderSettings):
    """Either ``s3_uri`` (input under ``<uri>/input``, output under ``<uri>/output``) or both buckets (with
    optional prefixes). On the sandbox every field may be left out."""

    base_url: str | None = Field(default=None, description="the Bedrock control-plane endpoint (default: the region's)")
    api_key_env: None = Field(default=None, description="not used: AWS credentials come from the standard chain")
    role_arn: str | None = Field(default=None, description="the service role Bedrock assumes to read and write S3")
    region: str | None = Field(default=None, description="default: the AWS chain's (AWS_REGION, the profile)")
    s3_uri: str | None = Field(default=None, description="s3://bucket/prefix for both input and output")
    input_bucket: str | None = None
    input_prefix: str = "batch-pipeline/input"
    output_bucket: str | None = None
    output_prefix: str = "batch-pipeline/output"
    s3_endpoint_url: str | None = Field(default=None, description="an S3-compatible endpoint (default: AWS's)")
    min_records: int = Field(
        default=DEFAULT_MIN_RECORDS,
        ge=1,
        description="the account's minimum records per job: smaller shards are never "
        "submitted as a batch (they go to the tail backend, or wait)",
    )
    timeout_hours: int = Field(default=24, ge=24, le=168, description="timeoutDurationInHours of each job")

    @model_validator(mode="after")
    def _where(self) -> Self:
        if self.sandbox:
            return self
        if not self.role_arn:
            raise ValueError("role_arn is required: the IAM service role Bedrock assumes for batch inference")
        if not self.s3_uri and not (self.input_bucket and self.output_bucket):
            raise ValueError("give s3_uri, or input_bucket and output_bucket: Bedrock reads and writes S3")
        if self.s3_uri:
            _split(self.s3_uri)
        return self

    def locations(self, sandbox_bucket: str | None = None) -> tuple[S3Location, S3Location]:
        """(input, output) locations; the sandbox's own bucket fills in what is not set."""
        if self.s3_uri:
            root = _split(self.s3_uri)
            return S3Location(root.bucket, root.key("input")), S3Location(root.bucket, root.key("output"))
        in_bucket = self.input_bucket or sandbox_bucket
        out_bucket = self.output_bucket or sandbox_bucket
        assert in_bucket and out_bucket, "validated: buckets are set outside the sandbox"
        return (
            S3Location(in_bucket, self.input_prefix.strip("/")),
            S3Location(out_bucket, self.output_prefix.strip("/")),
        )
