"""Amazon Bedrock batch inference executor (real ``boto3``: ``bedrock`` for jobs, ``s3`` for input and output).

submit writes the shard's records to S3 and creates a model invocation job named after the attempt key, with a
``clientRequestToken`` derived from it: a create retried after a timeout or a 5xx is the same job, never a
second one. A crash between create and record is repaired by ``find`` (the job name, listed with
``nameContains``, and the token checked). Every status is mapped explicitly; an unknown one is an error. fetch
reads ``<output>/<job id>/*.jsonl.out`` (lines joined on ``recordId`` by the runner) and checks
``manifest.json.out``'s counts against the lines read; a mismatch is logged as a warning.

The minimum number of records per job is a decision of the driver (``core/state/driver.py``): a shard below
``min_records`` is never submitted here; submit refuses one anyway, before anything is written or created.
"""

import hashlib
import json
import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, PartialCredentialsError

from batch_pipeline.core.error_table import Family, Where
from batch_pipeline.core.errors import BatchPipelineError, ConfigError, QuotaError, SystemicError, TransientError
from batch_pipeline.core.ledger.capacity import Dimension
from batch_pipeline.core.ledger.executor import BatchHandle, BatchState, BatchStatus, ShardWork
from batch_pipeline.executors.batch_backend import BatchBackend
from batch_pipeline.executors.bedrock.format import parse_output_block, request_lines
from batch_pipeline.executors.bedrock.sandbox import SANDBOX_CREDENTIALS, sandbox_s3
from batch_pipeline.executors.bedrock.session import aws_session
from batch_pipeline.executors.bedrock.settings import SANDBOX_ROLE_ARN, BedrockBatchSettings, S3Location
from batch_pipeline.executors.endpoint import resolve_endpoint
from batch_pipeline.executors.jsonl_blocks import parse_stream
from batch_pipeline.executors.provider_errors import classified, connection_error, redact, retry_after_s, retry_wait_s

log = logging.getLogger(__name__)

MAX_RECORDS = 50_000  # records per job (the service quota's default)
MAX_BYTES = 2**30  # bytes per input file (1 GB)
STATUS_MAP = {
    "Submitted": BatchState.VALIDATING,
    "Validating": BatchState.VALIDATING,
    "Scheduled": BatchState.VALIDATING,  # validated, queued: nothing has run yet
    "InProgress": BatchState.RUNNING,
    "Completed": BatchState.COMPLETED,
    "PartiallyCompleted": BatchState.EXPIRED,  # timed out while running: the processed records are kept
    "Expired": BatchState.EXPIRED,  # timed out before it started: no records at all
    "Failed": BatchState.FAILED,
    "Stopping": BatchState.CANCELLING,
    "Stopped": BatchState.CANCELLED,
}


def job_name(key: str) -> str:
    """The job's name from the attempt key ``job:shard:attempt`` (Bedrock allows [a-zA-Z0-9+-.], 63 chars)."""
    return key.replace("_", "-").replace(":", "-")[:63]


def request_token(key: str) -> str:
    """The create call's idempotency token: the same attempt key always asks for the same job."""
    return "bp" + hashlib.sha256(key.encode("utf-8")).hexdigest()


def translate(
    exc: Exception, action: str, *, where: Where = Where.CALL, dimension: Dimension | None = None
) -> BatchPipelineError:
    """botocore exception -> our error class (after the SDK's own retries were spent), by the one error table;
    credentials redacted. ``where=CREATE`` (with the ``dimension`` it fills) for the job create."""
    if isinstance(exc, ClientError):
        error = exc.response.get("Error") or {}
        meta = exc.response.get("ResponseMetadata") or {}
        code, status = str(error.get("Code") or "error"), int(meta.get("HTTPStatusCode") or 0)
        return classified(
            Family.BEDROCK,
            "Bedrock",
            action,
            status,
            code,
            str(error.get("Message") or ""),
            retry_after=retry_after_s(meta.get("HTTPHeaders")),
            where=where,
            dimension=dimension,
        )
    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        return SystemicError(
            f"Bedrock {action} failed: no AWS credentials in the standard chain (environment, "
            "profile, instance or pod role)",
            code="access_denied",
        )
    if isinstance(exc, BotoCoreError):
        return connection_error(Family.BEDROCK, "Bedrock", action, exc, where=where, dimension=dimension)
    return BatchPipelineError(redact(f"Bedrock {action} failed: {exc}"))


class BedrockBatchExecutor(BatchBackend):
    name = "bedrock_batch"
    quota_dimensions = (Dimension.JOBS,)
    pricing = "batch"
    max_requests_per_batch = MAX_RECORDS
    max_bytes_per_batch = MAX_BYTES
    settings_model = BedrockBatchSettings

    @staticmethod
    def min_requests(settings: BedrockBatchSettings) -> int:
        """Records a job needs at least (what the driver reads through the registry)."""
        return settings.min_records

    def __init__(self, settings: BedrockBatchSettings):
        super().__init__(settings)
        self.min_requests_per_batch = settings.min_records
        base_url, _ = resolve_endpoint(
            self.name, sandbox=settings.sandbox, base_url=settings.base_url, api_key_env=None, key_required=False
        )
        if settings.sandbox:
            self.session = aws_session(region_name="us-east-1", **SANDBOX_CREDENTIALS)
            self.role_arn = settings.role_arn or SANDBOX_ROLE_ARN
        else:
            self.session = aws_session(region_name=settings.region)  # the standard credential chain
            self.role_arn = settings.role_arn or ""
        config = Config(
            retries={"max_attempts": settings.max_retries + 1, "mode": "standard"},
            read_timeout=settings.timeout_s,
            connect_timeout=min(settings.timeout_s, 10),
        )
        self.client = self.session.client("bedrock", endpoint_url=base_url, config=config)
        self._sandbox_url = base_url if settings.sandbox else None
        self._config = config
        self._s3: Any = None
        self._where: tuple[S3Location, S3Location] | None = None

    # -- S3 -----------------------------------------------------------------------------------------------
    @property
    def s3(self) -> Any:
        if self._s3 is None:
            endpoint, bucket = self.settings.s3_endpoint_url, None
            if self._sandbox_url is not None:
                found = sandbox_s3(self._sandbox_url, self.settings.timeout_s)
                endpoint, bucket = endpoint or found.endpoint_url, found.bucket
            self._where = self.settings.locations(bucket)
            self._s3 = self.session.client(
                "s3",
                endpoint_url=endpoint,
                config=self._config.merge(Config(s3={"addressing_style": "path"} if endpoint else {})),
            )
        return self._s3

    @property
    def where(self) -> tuple[S3Location, S3Location]:
        _ = self.s3
        assert self._where is not None
        return self._where

    def _call(self, action: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (ClientError, BotoCoreError) as exc:
            raise translate(exc, action) from None

    # -- submit -------------------------------------------------------------------------------------------
    def submit(self, work: ShardWork) -> BatchHandle:
        n = work.items.num_rows
        if n > self.max_requests_per_batch:
            raise ConfigError(
                f"shard {work.shard_id} has {n} records; a Bedrock job takes at most "
                f"{self.max_requests_per_batch} (lower shards.max_requests)"
            )
        if n < self.min_requests_per_batch:
            raise ConfigError(
                f"shard {work.shard_id} has {n} records, below the minimum of "
                f"{self.min_requests_per_batch} per Bedrock job; the driver sends such shards to the "
                "tail backend (or they wait), never as a batch"
            )
        data = request_lines(work)
        if len(data) > self.max_bytes_per_batch:
            raise ConfigError(
                f"shard {work.shard_id} input is {len(data)} bytes; a Bedrock input file takes at most "
                f"{self.max_bytes_per_batch} (lower shards.max_bytes)"
            )
        source, target = self.where
        name = job_name(work.key)
        input_key = source.key(work.job, f"{name}.jsonl")
        self._call("input upload", self.s3.put_object, Bucket=source.bucket, Key=input_key, Body=data)
        request = {
            "jobName": name,
            "roleArn": self.role_arn,
            "modelId": work.plan.model,
            "clientRequestToken": request_token(work.key),
            "inputDataConfig": {
                "s3InputDataConfig": {"s3Uri": f"s3://{source.bucket}/{input_key}", "s3InputFormat": "JSONL"}
            },
            "outputDataConfig": {"s3OutputDataConfig": {"s3Uri": target.uri(work.job) + "/"}},
            "timeoutDurationInHours": self.settings.timeout_hours,
        }
        for attempt in range(self.settings.max_retries + 1):
            try:  # the token makes every try the same job: retrying is always safe
                arn = self.client.create_model_invocation_job(**request)["jobArn"]
                return BatchHandle(self.name, arn, work.key, f"s3://{source.bucket}/{input_key}")
            except (ClientError, BotoCoreError) as exc:
                error = translate(exc, "job create", where=Where.CREATE, dimension=Dimension.JOBS)
                if isinstance(error, QuotaError):  # ServiceQuotaExceededException: the model's job quota is full
                    raise error from None
                if not isinstance(error, TransientError) or attempt == self.settings.max_retries:
                    raise error from None
                wait = retry_wait_s(attempt, error.retry_after_s or None)
                log.info("job create for %s: %s; retrying in %.2f s (same clientRequestToken)", work.key, error, wait)
                time.sleep(wait)
        raise AssertionError("unreachable")

    # -- poll / fetch ----------------------------------------------------------------------------------------
    def _job(self, handle: BatchHandle) -> dict[str, Any]:
        return self._call("job retrieve", self.client.get_model_invocation_job, jobIdentifier=handle.batch_id)

    def poll(self, handle: BatchHandle) -> BatchStatus:
        job = self._job(handle)
        status = job.get("status")
        try:
            state = STATUS_MAP[status]
        except KeyError:
            raise BatchPipelineError(f"Bedrock job {handle.batch_id} has unknown status {status!r}") from None
        errors = [job["message"]] if job.get("message") and state == BatchState.FAILED else []
        return BatchStatus(
            state,
            str(status),
            int(job.get("totalRecordCount") or 0),
            int(job.get("successRecordCount") or 0),
            int(job.get("errorRecordCount") or 0),
            errors,
        )

    def fetch(self, handle: BatchHandle) -> Iterator[pa.Table]:
        job = self._job(handle)
        bucket, prefix = _output_folder(job, handle.batch_id)
        listing = self._call("output list", self.s3.list_objects_v2, Bucket=bucket, Prefix=prefix)
        keys = sorted(item["Key"] for item in listing.get("Contents") or [])
        lines = succeeded = 0
        for key in (k for k in keys if k.endswith(".jsonl.out")):
            body = self._call("output download", self.s3.get_object, Bucket=bucket, Key=key)["Body"]
            for table in parse_stream(parse_output_block, self._chunks(body, key), self.parse_workers):
                lines += table.num_rows
                succeeded += int(pc.sum(pc.equal(table.column("http_status"), 200)).as_py() or 0)
                yield table
        self._check_manifest(job, bucket, prefix + "manifest.json.out", keys, lines, succeeded)

    def _chunks(self, body: Any, key: str) -> Iterator[bytes]:
        """The object's bytes; a connection that breaks mid-download is a TransientError (the runner fetches again)."""
        try:
            yield from body.iter_chunks(1 << 20)
        except (ClientError, BotoCoreError) as exc:
            raise translate(exc, f"output download of {key}") from None

    def _check_manifest(
        self, job: dict[str, Any], bucket: str, key: str, keys: list[str], lines: int, succeeded: int
    ) -> None:
        """manifest.json.out's counts against the lines read and the job's record total; a mismatch is logged."""
        if key not in keys:
            log.warning("Bedrock job %s: no manifest.json.out under s3://%s/%s", job.get("jobArn"), bucket, key)
            return
        raw = self._call("manifest download", self.s3.get_object, Bucket=bucket, Key=key)["Body"].read()
        manifest = json.loads(raw)
        ours = {
            "processedRecordCount": lines,
            "successRecordCount": succeeded,
            "errorRecordCount": lines - succeeded,
            "totalRecordCount": int(job.get("totalRecordCount") or manifest.get("totalRecordCount") or 0),
        }
        differ = {k: (manifest.get(k), v) for k, v in ours.items() if manifest.get(k) != v}
        if differ:
            log.warning(
                "Bedrock job %s: manifest.json.out does not match the output read: %s",
                job.get("jobArn"),
                ", ".join(f"{k} {m} in the manifest, {v} here" for k, (m, v) in differ.items()),
            )
        else:
            log.info(
                "Bedrock job %s: manifest.json.out matches the output (%d records, %d succeeded)",
                job.get("jobArn"),
                lines,
                succeeded,
            )

    # -- cancel / find ---------------------------------------------------------------------------------------
    def cancel(self, handle: BatchHandle) -> None:
        try:
            self.client.stop_model_invocation_job(jobIdentifier=handle.batch_id)
        except (ClientError, BotoCoreError) as exc:
            error = translate(exc, "job stop")
            if (
                isinstance(error, SystemicError)
                and error.code == "ValidationException"
                and self.poll(handle).state.ended
            ):
                return  # it ended between our poll and the stop: nothing to stop
            raise error from None

    def discard(self, handle: BatchHandle) -> list[str]:
        """Delete our own S3 objects of the attempt once its results are stored: the input we uploaded and the
        job's output folder (``<output>/<job id>/``). The job record holds no data and stays. S3 answers a delete
        of a missing key as done, so a repeated try is harmless."""
        job = self._job(handle)
        source = handle.input_file_id or job.get("inputDataConfig", {}).get("s3InputDataConfig", {}).get("s3Uri")
        keys: list[tuple[str, str]] = []
        if source:
            bucket, _, key = source[len("s3://") :].partition("/")
            keys.append((bucket, key))
        bucket, prefix = _output_folder(job, handle.batch_id)
        pages = self._call(
            "output list", self.s3.get_paginator("list_objects_v2").paginate, Bucket=bucket, Prefix=prefix
        )
        try:
            keys += [(bucket, item["Key"]) for page in pages for item in page.get("Contents") or []]
        except (ClientError, BotoCoreError) as exc:
            raise translate(exc, "output list") from None
        for bucket, key in keys:
            self._call("object delete", self.s3.delete_object, Bucket=bucket, Key=key)
        return [f"s3://{bucket}/{key}" for bucket, key in keys]

    def find(
        self, key: str, request_ids: Sequence[str] | None = None, not_before: str | None = None
    ) -> BatchHandle | None:
        """The job this attempt created: by its name (``nameContains``), confirmed by the token when listed."""
        name, token = job_name(key), request_token(key)
        scanned, next_token = 0, None
        while scanned < self.settings.find_scan_limit:
            page = self._call(
                "job list",
                self.client.list_model_invocation_jobs,
                nameContains=name,
                sortBy="CreationTime",
                sortOrder="Descending",
                maxResults=100,
                **({"nextToken": next_token} if next_token else {}),
            )
            for job in page.get("invocationJobSummaries") or []:
                scanned += 1
                if job.get("jobName") == name and job.get("clientRequestToken") in (None, token):
                    source = job.get("inputDataConfig", {}).get("s3InputDataConfig", {}).get("s3Uri")
                    return BatchHandle(self.name, job["jobArn"], key, source)
            next_token = page.get("nextToken")
            if not next_token:
                break
        return None


def _output_folder(job: dict[str, Any], arn: str) -> tuple[str, str]:
    """(bucket, prefix) where Bedrock writes this job's output: ``<output s3Uri>/<job id>/``."""
    uri = job["outputDataConfig"]["s3OutputDataConfig"]["s3Uri"]
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    prefix = prefix.strip("/")
    job_id = arn.rsplit("/", 1)[-1]
    return bucket, (prefix + "/" if prefix else "") + job_id + "/"
