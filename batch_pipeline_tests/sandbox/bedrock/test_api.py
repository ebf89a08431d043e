"""The sandbox's Bedrock control plane through plain ``boto3.client("bedrock", endpoint_url=URL)`` and its S3."""

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from batch_pipeline.sandbox import start_sandbox_process, stop_sandbox_process

ROLE = "arn:aws:iam::123456789012:role/r"
MODEL = "anthropic.claude-3-5-haiku-20241022-v1:0"
KEYS = {"region_name": "us-east-1", "aws_access_key_id": "AKIDEXAMPLE", "aws_secret_access_key": "x"}
NO_RETRY = Config(retries={"max_attempts": 1, "mode": "standard"})


def info(url: str) -> dict:
    with urllib.request.urlopen(url + "/_sandbox/bedrock") as response:
        return json.loads(response.read())


@pytest.fixture
def aws(admin, sandbox_proc):
    _, url = sandbox_proc
    where = info(url)
    return (
        boto3.client("bedrock", endpoint_url=url, config=NO_RETRY, **KEYS),
        boto3.client("s3", endpoint_url=where["s3_endpoint_url"], **KEYS),
        where["bucket"],
    )


def record(i: int, **model_input) -> dict:
    body = {
        "anthropic_version": "bedrock-2023-05-31",
        "max_tokens": 32,
        "messages": [{"role": "user", "content": f"ticket {i}"}],
        **model_input,
    }
    return {"recordId": f"r{i:04d}", "modelInput": body}


def put_input(s3, bucket: str, key: str, records: list[dict]) -> str:
    s3.put_object(Bucket=bucket, Key=key, Body="".join(json.dumps(r) + "\n" for r in records).encode())
    return f"s3://{bucket}/{key}"


def create(bedrock, uri: str, bucket: str, name: str = "job-1", **extra) -> str:
    return bedrock.create_model_invocation_job(
        jobName=name,
        roleArn=ROLE,
        modelId=MODEL,
        inputDataConfig={"s3InputDataConfig": {"s3Uri": uri}},
        outputDataConfig={"s3OutputDataConfig": {"s3Uri": f"s3://{bucket}/out/"}},
        **extra,
    )["jobArn"]


def wait(bedrock, arn: str, timeout: float = 60.0) -> dict:
    """Poll until the job has ended (a generous deadline: a loaded machine is slow, not wrong)."""
    deadline = time.monotonic() + timeout
    while True:
        job = bedrock.get_model_invocation_job(jobIdentifier=arn)
        if job["status"] in ("Completed", "PartiallyCompleted", "Failed", "Stopped", "Expired"):
            return job
        assert time.monotonic() < deadline, f"job {arn} never ended: {job['status']}"
        time.sleep(0.05)


def output(s3, bucket: str, arn: str) -> dict[str, bytes]:
    prefix = f"out/{arn.rsplit('/', 1)[-1]}/"
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents") or []]
    return {k[len(prefix) :]: s3.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys}


def test_a_job_runs_against_s3_and_writes_its_output_and_manifest(aws, admin):
    bedrock, s3, bucket = aws
    uri = put_input(
        s3,
        bucket,
        "in/a.jsonl",
        [record(i) for i in range(100)] + [record(100, model="x"), {"modelInput": record(101)["modelInput"]}],
    )
    arn = create(bedrock, uri, bucket, clientRequestToken="tok1")
    assert arn.startswith("arn:aws:bedrock:us-east-1:123456789012:model-invocation-job/")
    job = wait(bedrock, arn)
    assert (job["status"], job["totalRecordCount"], job["successRecordCount"], job["errorRecordCount"]) == (
        "Completed",
        102,
        101,
        1,
    )
    assert job["submitTime"].tzinfo is not None and job["endTime"] >= job["submitTime"]
    files = output(s3, bucket, arn)
    assert sorted(files) == ["a.jsonl.out", "manifest.json.out"]
    lines = [json.loads(line) for line in files["a.jsonl.out"].splitlines()]
    assert len(lines) == 102 and [ln["recordId"] for ln in lines] != sorted(ln["recordId"] for ln in lines)
    bad = next(ln for ln in lines if ln["recordId"] == "r0100")
    assert bad["error"]["errorCode"] == 400 and "extraneous key [model]" in bad["error"]["errorMessage"]
    generated = [ln for ln in lines if not ln["recordId"].startswith("r0")]
    assert len(generated) == 1 and len(generated[0]["recordId"]) == 11  # a record without an ID gets one
    good = next(ln for ln in lines if ln["recordId"] == "r0001")
    assert good["modelInput"] == record(1)["modelInput"] and good["modelOutput"]["type"] == "message"
    assert set(good["modelOutput"]["usage"]) >= {"input_tokens", "output_tokens"}
    manifest = json.loads(files["manifest.json.out"])
    assert manifest["totalRecordCount"] == 102 and manifest["successRecordCount"] == 101
    assert manifest["inputTokenCount"] == sum(
        ln["modelOutput"]["usage"]["input_tokens"] for ln in lines if "modelOutput" in ln
    )
    ledger = admin.ledger()  # one entry per billed (successful) record
    assert (
        len(ledger) == 101
        and {e["provider"] for e in ledger} == {"bedrock"}
        and "r0100" not in {e["custom_id"] for e in ledger}
    )


def test_the_same_client_request_token_is_the_same_job(aws, admin):
    bedrock, s3, bucket = aws
    uri = put_input(s3, bucket, "in/b.jsonl", [record(i) for i in range(100)])
    first = create(bedrock, uri, bucket, clientRequestToken="same")
    assert create(bedrock, uri, bucket, clientRequestToken="same") == first
    assert create(bedrock, uri, bucket, name="job-2") != first  # botocore fills a fresh token: a new job
    wait(bedrock, first)
    assert len(bedrock.list_model_invocation_jobs()["invocationJobSummaries"]) == 2


def test_a_too_small_job_and_bad_parameters_are_validation_errors(aws, admin):
    bedrock, s3, bucket = aws
    small = put_input(s3, bucket, "in/small.jsonl", [record(i) for i in range(99)])
    with pytest.raises(ClientError) as caught:
        create(bedrock, small, bucket)
    assert caught.value.response["Error"]["Code"] == "ValidationException"
    assert "(99) is below the minimum of 100 records" in caught.value.response["Error"]["Message"]
    admin.set_scenario("normal", min_records=50)  # an account with a lower quota
    assert create(bedrock, small, bucket)
    for bad in ({"jobName": "_bad"}, {"jobName": "a" * 64}):  # the pattern, the length (botocore checks neither)
        with pytest.raises(ClientError) as caught:
            bedrock.create_model_invocation_job(
                **{
                    "jobName": "ok",
                    "roleArn": ROLE,
                    "modelId": MODEL,
                    "timeoutDurationInHours": 24,
                    "inputDataConfig": {"s3InputDataConfig": {"s3Uri": small}},
                    "outputDataConfig": {"s3OutputDataConfig": {"s3Uri": f"s3://{bucket}/out/"}},
                    **bad,
                }
            )
        assert caught.value.response["Error"]["Code"] == "ValidationException"


def test_list_filters_and_pages_and_an_unknown_job_is_not_found(aws, admin):
    bedrock, s3, bucket = aws
    uri = put_input(s3, bucket, "in/c.jsonl", [record(i) for i in range(100)])
    arns = [create(bedrock, uri, bucket, name=f"demo-s0000{i}-1") for i in range(3)]
    other = create(bedrock, uri, bucket, name="other-job")
    found = bedrock.list_model_invocation_jobs(nameContains="demo-s0000")["invocationJobSummaries"]
    assert [j["jobArn"] for j in found] == arns[::-1]  # newest first
    page = bedrock.list_model_invocation_jobs(maxResults=2)
    rest = bedrock.list_model_invocation_jobs(maxResults=2, nextToken=page["nextToken"])
    assert len(page["invocationJobSummaries"]) == 2 and len(rest["invocationJobSummaries"]) == 2
    assert "nextToken" not in rest
    # a real job's ARN with its last digit changed to one no job of this (freshly reset) sandbox has
    unknown = next(a for a in (arns[0][:-1] + c for c in "0123456789abcdef") if a not in {*arns, other})
    with pytest.raises(ClientError) as caught:
        bedrock.get_model_invocation_job(jobIdentifier=unknown)
    assert caught.value.response["Error"]["Code"] == "ResourceNotFoundException"
    assert bedrock.get_model_invocation_job(jobIdentifier=arns[0].rsplit("/", 1)[-1])["jobArn"] == arns[0]


def test_stop_ends_stopped_and_an_ended_job_cannot_be_stopped(aws, admin):
    bedrock, s3, bucket = aws
    admin.set_scenario("normal", in_progress_s=20.0)
    arn = create(bedrock, put_input(s3, bucket, "in/d.jsonl", [record(i) for i in range(100)]), bucket)
    admin.clock(advance_s=10.0)
    bedrock.stop_model_invocation_job(jobIdentifier=arn)
    assert bedrock.get_model_invocation_job(jobIdentifier=arn)["status"] == "Stopping"
    job = wait(bedrock, arn)
    assert job["status"] == "Stopped" and 0 < job["processedRecordCount"] < 100
    assert len(output(s3, bucket, arn)["d.jsonl.out"].splitlines()) == job["processedRecordCount"]
    with pytest.raises(ClientError) as caught:
        bedrock.stop_model_invocation_job(jobIdentifier=arn)
    assert caught.value.response["Error"]["Code"] == "ValidationException"  # 400, not a retried 409


def test_tags_choose_a_job_scenario_and_the_timeout_expires_a_job(aws, admin):
    bedrock, s3, bucket = aws
    uri = put_input(s3, bucket, "in/e.jsonl", [record(i) for i in range(100)])
    partial = create(
        bedrock,
        uri,
        bucket,
        tags=[{"key": "sandbox_scenario", "value": "expire"}, {"key": "sandbox_param_complete_share", "value": "0.3"}],
    )
    job = wait(bedrock, partial)
    assert (job["status"], job["processedRecordCount"]) == ("PartiallyCompleted", 30)
    admin.set_scenario("slow", in_progress_s=10 * 24 * 3600.0)
    late = create(bedrock, uri, bucket, name="late", timeoutDurationInHours=24)
    admin.clock(advance_s=24 * 3600.0 + 1)
    job = bedrock.get_model_invocation_job(jobIdentifier=late)
    assert job["status"] == "PartiallyCompleted" and 0 < job["processedRecordCount"] < 100
    admin.set_scenario("expire", complete_share=0.0)
    never = create(bedrock, uri, bucket, name="never")
    assert wait(bedrock, never)["status"] == "Expired" and output(s3, bucket, never) == {}


@pytest.mark.parametrize(
    ("keys", "scenario", "code"),
    [
        ({**KEYS, "aws_access_key_id": "sandbox-bad"}, "normal", "UnrecognizedClientException"),
        (KEYS, "access_denied", "AccessDeniedException"),
    ],
)
def test_credentials_and_access_are_checked(aws, admin, sandbox_proc, keys, scenario, code):
    admin.set_scenario(scenario)
    client = boto3.client("bedrock", endpoint_url=sandbox_proc[1], config=NO_RETRY, **keys)
    with pytest.raises(ClientError) as caught:
        client.list_model_invocation_jobs()
    assert caught.value.response["Error"]["Code"] == code
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403


def test_unsigned_requests_are_refused_and_routes_do_not_collide(aws, sandbox_proc):
    url = sandbox_proc[1]
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(url + "/model-invocation-jobs")
    assert (
        caught.value.code == 403 and caught.value.headers["x-amzn-ErrorType"] == "MissingAuthenticationTokenException"
    )
    with pytest.raises(urllib.error.HTTPError) as caught:  # the OpenAI routes keep their own envelope
        urllib.request.urlopen(url + "/v1/batches")
    assert caught.value.code == 401 and "error" in json.loads(caught.value.read())


def test_throttling_is_a_429_throttling_exception_that_botocore_retries(aws, admin, sandbox_proc):
    admin.set_scenario("rate_limit", on=["bedrock_list"], times=2, retry_after_ms=10)
    bedrock, _, _ = aws
    with pytest.raises(ClientError) as caught:
        bedrock.list_model_invocation_jobs()
    assert caught.value.response["Error"]["Code"] == "ThrottlingException"
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 429
    retrying = boto3.client(
        "bedrock", endpoint_url=sandbox_proc[1], config=Config(retries={"max_attempts": 3, "mode": "standard"}), **KEYS
    )
    assert retrying.list_model_invocation_jobs()["invocationJobSummaries"] == []


@pytest.fixture(params=["env", "flag"])
def given_s3(request) -> Iterator[tuple[str, str]]:
    """A moto S3 server of the test's own, and a sandbox process told to use it ($BATCH_PIPELINE_SANDBOX_S3_URL,
    or ``--s3-url``)."""
    from moto.server import ThreadedMotoServer

    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, port = moto.get_host_and_port()
    s3_url = f"http://{host}:{port}"
    proc, url = (
        start_sandbox_process(env={"BATCH_PIPELINE_SANDBOX_S3_URL": s3_url})
        if request.param == "env"
        else start_sandbox_process(args=["--s3-url", s3_url])
    )
    try:
        yield url, s3_url
    finally:
        stop_sandbox_process(proc)
        moto.stop()


def test_a_given_s3_endpoint_is_used_instead_of_its_own(given_s3):
    url, s3_url = given_s3
    where = info(url)
    assert where["s3_endpoint_url"] == s3_url
    s3 = boto3.client("s3", endpoint_url=s3_url, **KEYS)
    bedrock = boto3.client("bedrock", endpoint_url=url, **KEYS)
    arn = create(
        bedrock, put_input(s3, where["bucket"], "in/f.jsonl", [record(i) for i in range(100)]), where["bucket"]
    )
    assert wait(bedrock, arn)["status"] == "Completed"
    assert "manifest.json.out" in output(s3, where["bucket"], arn)
