"""Handlers of Bedrock's batch inference control plane, at the paths botocore's ``bedrock`` client calls.

``boto3.client("bedrock", endpoint_url=SANDBOX_URL)`` works unchanged: ``POST /model-invocation-job``,
``GET /model-invocation-job/{jobIdentifier}`` (the ARN percent-encoded), ``GET /model-invocation-jobs`` and
``POST /model-invocation-job/{jobIdentifier}/stop``; none of them collides with ``/v1/...`` or ``/_sandbox``.
Any SigV4 credentials are accepted (the access key ``sandbox-bad`` is refused, as is everything under the
``access_denied`` scenario). Jobs read their input from, and write their output to, the sandbox's S3
(``GET /_sandbox/bedrock`` says where it is).
"""

from __future__ import annotations

import re
import secrets
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote

from batch_pipeline.sandbox.bedrock.errors import BedrockError, validation
from batch_pipeline.sandbox.bedrock.jobs import BedrockJob, BedrockJobs, new_job_order
from batch_pipeline.sandbox.bedrock.records import InputError, InputRecord, parse_input
from batch_pipeline.sandbox.bedrock.s3 import DEFAULT_BUCKET, REGION, S3Unavailable, SandboxS3, split_uri
from batch_pipeline.sandbox.quotas import account_of, quota
from batch_pipeline.sandbox.routing import Request, Response, Router
from batch_pipeline.sandbox.scenarios import UNKNOWN_MODEL_PREFIX, Scenario, scenario_from_metadata

JOB, JOBS = "/model-invocation-job", "/model-invocation-jobs"
ACCOUNT = "123456789012"
BAD_ACCESS_KEY = "sandbox-bad"
MAX_RECORDS = 50_000
JOB_NAME_RE = re.compile(r"^[a-zA-Z0-9]{1,63}(-*[a-zA-Z0-9\+\-\.]){0,63}$")
TOKEN_RE = re.compile(r"^[a-zA-Z0-9]{1,256}(-*[a-zA-Z0-9]){0,256}$")
_CREDENTIAL_RE = re.compile(r"Credential=([^/,\s]+)/\d{8}/([a-z0-9-]+)/([a-z0-9-]+)/aws4_request")
NO_CREDIT = (
    "Model access is denied due to INVALID_PAYMENT_INSTRUMENT:A valid payment instrument must be provided. "
    "Your AWS Marketplace subscription for this model cannot be completed at this time."
)


def is_bedrock_path(path: str) -> bool:
    """True for the paths answered in Bedrock's error shape."""
    return path == JOB or path == JOBS or path.startswith(JOB + "/")


def check_bedrock_auth(request: Request, scenario: Scenario) -> None:
    """403 without a SigV4 ``Authorization`` header, for the access key ``sandbox-bad``, and under ``access_denied``."""
    found = _CREDENTIAL_RE.search(request.headers.get("authorization", ""))
    if not request.headers.get("authorization", "").startswith("AWS4-HMAC-SHA256") or found is None:
        raise BedrockError(403, "Missing Authentication Token", type="MissingAuthenticationTokenException")
    if found.group(1) == BAD_ACCESS_KEY:
        raise BedrockError(
            403, "The security token included in the request is invalid.", type="UnrecognizedClientException"
        )
    if scenario.name == "access_denied":
        raise BedrockError(
            403,
            "You don't have access to the model with the specified model ID. (sandbox scenario access_denied)",
            type="AccessDeniedException",
        )


def _region(request: Request) -> str:
    found = _CREDENTIAL_RE.search(request.headers.get("authorization", ""))
    return found.group(2) if found else REGION


def _s3_config(body: dict[str, Any], outer: str, inner: str) -> str:
    config = body.get(outer)
    uri = ((config or {}).get(inner) or {}).get("s3Uri") if isinstance(config, dict) else None
    if not isinstance(uri, str):
        raise validation(f"{outer}.{inner}.s3Uri is required")
    try:
        split_uri(uri)
    except ValueError as exc:
        raise validation(str(exc)) from None
    return uri


def _time_param(request: Request, name: str) -> float | None:
    raw = request.query.get(name)
    if not raw:
        return None
    try:
        moment = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise validation(f"{name}: {raw!r} is not an ISO 8601 timestamp") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


class BedrockApi:
    """The four control-plane operations over the sandbox state (callers hold its lock)."""

    def __init__(self, state: Any) -> None:
        self.state = state

    @property
    def jobs(self) -> BedrockJobs:
        return self.state.bedrock

    @property
    def s3(self) -> SandboxS3:
        return self.state.bedrock.s3

    def register(self, router: Router) -> None:
        router.add("POST", JOB, "bedrock_create", self.create)
        router.add("GET", JOBS, "bedrock_list", self.list)
        router.add("GET", JOB + "/{job}", "bedrock_get", self.get)
        router.add("POST", JOB + "/{job}/stop", "bedrock_stop", self.stop)
        router.add("GET", "/_sandbox/bedrock", "admin_bedrock", self.info)

    def info(self, request: Request) -> Response:
        """Where the sandbox's S3 is (started on first ask) and the bucket it made for jobs."""
        try:
            url = self.s3.url
        except S3Unavailable as exc:
            raise BedrockError(503, str(exc), type="ServiceUnavailableException") from None
        return Response(
            payload={"s3_endpoint_url": url, "bucket": DEFAULT_BUCKET, "region": REGION, "account": ACCOUNT}
        )

    def _job(self, request: Request) -> BedrockJob:
        ident = unquote(request.params["job"])
        job = self.jobs.records.get(ident.rsplit("/", 1)[-1])
        if job is None or (ident.startswith("arn:") and ident != job.arn):
            raise BedrockError(404, f"The specified job {ident} does not exist.")
        return job

    def create(self, request: Request) -> Response:
        body = request.json()
        token = body.get("clientRequestToken")
        if token is not None and (not isinstance(token, str) or not TOKEN_RE.match(token)):
            raise validation("clientRequestToken: must match [a-zA-Z0-9]{1,256}(-*[a-zA-Z0-9]){0,256}")
        known = self.jobs.by_token(token) if token else None
        if known is not None:  # the same request again: the same job, no error (idempotency)
            return Response(payload={"jobArn": known.arn}, batch_id=known.job_id)
        for key in ("jobName", "roleArn", "modelId"):
            if not isinstance(body.get(key), str) or not body[key]:
                raise validation(f"{key} is required")
        if not JOB_NAME_RE.match(body["jobName"]) or len(body["jobName"]) > 63:
            raise validation(
                f"jobName {body['jobName']!r}: at most 63 characters of [a-zA-Z0-9+-.], starting with a letter or digit"
            )
        hours = body.get("timeoutDurationInHours", 168)
        if not isinstance(hours, int) or not 24 <= hours <= 168:
            raise validation("timeoutDurationInHours must be between 24 and 168")
        tags = {t.get("key"): t.get("value") for t in body.get("tags") or [] if isinstance(t, dict)}
        try:
            scenario = scenario_from_metadata(tags) or self.state.scenario
        except ValueError as exc:
            raise validation(f"tags: {exc}") from None
        model = body["modelId"]
        if model.startswith(UNKNOWN_MODEL_PREFIX) or scenario.name == "unknown_model":
            raise validation(f"The provided model identifier is invalid: {model}.")
        if scenario.name == "no_credit":
            raise BedrockError(403, NO_CREDIT, type="AccessDeniedException")
        input_uri = _s3_config(body, "inputDataConfig", "s3InputDataConfig")
        output_uri = _s3_config(body, "outputDataConfig", "s3OutputDataConfig")
        account = account_of(request, "bedrock")
        self._check_concurrent(account, model)
        records, problem = self._read_input(input_uri)
        minimum = int(scenario.param("min_records"))
        if problem is None and len(records) < minimum:
            raise validation(
                f"The number of records in the input ({len(records)}) is below the minimum of "
                f"{minimum} records per batch inference job."
            )
        maximum = quota(self.state.scenario, "max_records_per_job") or MAX_RECORDS
        over = problem is None and len(records) > maximum
        if over:
            problem = (
                f"The number of records in the input ({len(records)}) exceeds the maximum of {maximum} "
                "records per batch inference job."
            )
        now = self.state.clock.now()
        job_id = secrets.token_hex(6)
        job = BedrockJob(
            job_id=job_id,
            arn=f"arn:aws:bedrock:{_region(request)}:{ACCOUNT}:model-invocation-job/{job_id}",
            name=body["jobName"],
            model_id=model,
            role_arn=body["roleArn"],
            client_request_token=token or secrets.token_hex(16),
            input_uri=input_uri,
            output_uri=output_uri,
            timeout_hours=hours,
            submit_time=now,
            records=records,
            order=new_job_order(records),
            scenario=scenario,
            tags=tags,
            last_modified=now,
            account=account,
            input_error=problem,
        )
        self.jobs.submit(job, refused=over)
        return Response(payload={"jobArn": job.arn}, batch_id=job.job_id)

    def _check_concurrent(self, account: str, model: str) -> None:
        """400 ``ServiceQuotaExceededException`` when the account already has ``quota_concurrent_jobs`` jobs of
        the model submitted, validating, scheduled or in progress."""
        cap = quota(self.state.scenario, "quota_concurrent_jobs")
        live = self.state.book.enqueued("bedrock", account, model).jobs
        if not cap or live < cap:
            return
        self.state.book.refuse("bedrock", "", account, [model], self.state.clock.now())
        raise BedrockError(
            400,
            f"You have {live} batch inference jobs for {model} submitted or in progress in "
            f"this account. Limit: {cap} jobs submitted, validating, scheduled or in progress "
            "per model. Wait for a job to end, or request a quota increase.",
            type="ServiceQuotaExceededException",
        )

    def _read_input(self, uri: str) -> tuple[list[InputRecord], str | None]:
        """Every record of the input (one ``.jsonl`` object, or every ``.jsonl`` object under a prefix), and why
        it cannot be used (None when it can): the job fails on that during Validating, as Bedrock's do."""
        bucket, key = split_uri(uri)
        try:
            keys = [key] if key.endswith(".jsonl") else [k for k in self.s3.keys(bucket, key) if k.endswith(".jsonl")]
            if not keys:
                raise KeyError(uri)
            records: list[InputRecord] = []
            for name in keys:
                records.extend(parse_input(name, self.s3.read(bucket, name)))
        except S3Unavailable as exc:
            raise BedrockError(503, str(exc), type="ServiceUnavailableException") from None
        except KeyError:
            return [], f"Unable to read the input at {uri}: no such object or no .jsonl file under it."
        except InputError as exc:
            return [], f"The input is not valid JSONL records: {exc}"
        return records, None

    def get(self, request: Request) -> Response:
        job = self._job(request)
        return Response(payload=job.summary(), batch_id=job.job_id)

    def stop(self, request: Request) -> Response:
        job = self._job(request)
        if not self.jobs.stop(job, self.state.clock.now()):
            raise validation(f"Job {job.arn} is {job.status} and cannot be stopped.")
        return Response(payload={}, batch_id=job.job_id)

    def list(self, request: Request) -> Response:
        query = request.query
        try:
            limit = int(query.get("maxResults") or 1000)
            offset = int(query.get("nextToken") or 0)
        except ValueError:
            raise validation("maxResults and nextToken must be integers") from None
        if not 1 <= limit <= 1000:
            raise validation("maxResults must be between 1 and 1000")
        after, before = _time_param(request, "submitTimeAfter"), _time_param(request, "submitTimeBefore")
        jobs = self.jobs.newest_first()
        if query.get("sortOrder") == "Ascending":
            jobs.reverse()
        jobs = [
            j
            for j in jobs
            if (not query.get("statusEquals") or j.status == query["statusEquals"])
            and (not query.get("nameContains") or query["nameContains"] in j.name)
            and (after is None or j.submit_time > after)
            and (before is None or j.submit_time < before)
        ]
        page = jobs[offset : offset + limit]
        payload: dict[str, Any] = {"invocationJobSummaries": [j.summary() for j in page]}
        if offset + limit < len(jobs):
            payload["nextToken"] = str(offset + limit)
        return Response(payload=payload)
