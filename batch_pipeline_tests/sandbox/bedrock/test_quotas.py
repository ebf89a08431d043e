"""Bedrock's job quotas and input validation through plain boto3: ``quota_concurrent_jobs`` (per access key and
model, jobs submitted to in progress) refuses a create with ``ServiceQuotaExceededException`` exactly past the cap;
``max_records_per_job`` and a missing or unreadable input are found while the job is ``Validating``, which then
ends ``Failed`` with a message; nothing refused is billed."""

from __future__ import annotations

import boto3
import pytest

from ..support import assert_never_over, load_events
from .test_api import KEYS, MODEL, NO_RETRY, aws, create, put_input, record, wait  # noqa: F401 (aws: a fixture)

THIRD = 0.05 / 3  # the default validating_s: Submitted, Validating, Scheduled take a third each


def other_key(url: str):
    return boto3.client("bedrock", endpoint_url=url, config=NO_RETRY, **{**KEYS, "aws_access_key_id": "AKIDOTHER"})


def test_concurrent_jobs_past_the_cap_are_refused_per_key_and_model_and_freed_when_one_ends(aws, admin, sandbox_proc):
    bedrock, s3, bucket = aws
    uri = put_input(s3, bucket, "in/q.jsonl", [record(i) for i in range(100)])
    admin.set_scenario("normal", quota_concurrent_jobs=2, in_progress_s=10.0)
    admin.clock(freeze=True)
    held = [create(bedrock, uri, bucket, name=f"q-{i}") for i in range(2)]  # exactly the cap
    with pytest.raises(bedrock.exceptions.ServiceQuotaExceededException) as caught:  # botocore's modelled class
        create(bedrock, uri, bucket, name="q-2")
    error = caught.value.response
    assert error["Error"]["Code"] == "ServiceQuotaExceededException"
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 400 and "Limit: 2 jobs" in error["Error"]["Message"]
    assert create(other_key(sandbox_proc[1]), uri, bucket, name="q-other")  # another account
    other_model = bedrock.create_model_invocation_job(
        jobName="q-haiku",
        roleArn="arn:aws:iam::123456789012:role/r",
        modelId="anthropic.claude-haiku-4-5",
        inputDataConfig={"s3InputDataConfig": {"s3Uri": uri}},
        outputDataConfig={"s3OutputDataConfig": {"s3Uri": f"s3://{bucket}/out/"}},
    )["jobArn"]
    assert other_model  # another model of the same account
    bedrock.stop_model_invocation_job(jobIdentifier=held[0])  # a stopping job no longer counts
    later = create(bedrock, uri, bucket, name="q-3")
    admin.clock(advance_s=11.0)
    assert {wait(bedrock, arn)["status"] for arn in (held[1], later)} == {"Completed"}
    assert wait(bedrock, held[0])["status"] == "Stopped"
    jobs = bedrock.list_model_invocation_jobs()["invocationJobSummaries"]
    assert sorted(j["jobName"] for j in jobs) == ["q-0", "q-1", "q-3", "q-haiku", "q-other"]  # no q-2
    billed = [e["batch_id"] for e in admin.ledger()]  # the refused create made no job and bills nothing
    assert set(billed) <= {j["jobArn"].rsplit("/", 1)[-1] for j in jobs}
    assert len(billed) == sum(wait(bedrock, j["jobArn"])["successRecordCount"] for j in jobs) == 400
    load = admin.load()
    assert assert_never_over(load, "bedrock", "jobs", 2) == 2 and load["refusals"] == 1
    mine = [e for e in load_events(load, "bedrock") if (e["account"], e["model"]) == ("AKIDEXAMPLE", MODEL)]
    assert [e["event"] for e in mine] == ["enqueue", "enqueue", "refuse", "release", "enqueue", "release", "release"]
    assert {e["account"] for e in load["events"]} == {"AKIDEXAMPLE", "AKIDOTHER"}


def test_a_job_over_max_records_is_created_then_fails_while_validating(aws, admin):
    bedrock, s3, bucket = aws
    admin.set_scenario("normal", max_records_per_job=100)
    admin.clock(freeze=True)
    at_max = create(bedrock, put_input(s3, bucket, "in/max.jsonl", [record(i) for i in range(100)]), bucket)
    over = create(bedrock, put_input(s3, bucket, "in/over.jsonl", [record(i) for i in range(101)]), bucket, name="over")
    assert bedrock.get_model_invocation_job(jobIdentifier=over)["status"] == "Submitted"
    admin.clock(advance_s=THIRD * 1.5)
    assert bedrock.get_model_invocation_job(jobIdentifier=over)["status"] == "Validating"
    admin.clock(advance_s=THIRD)
    job = bedrock.get_model_invocation_job(jobIdentifier=over)
    assert job["status"] == "Failed" and "(101) exceeds the maximum of 100 records" in job["message"]
    admin.clock(advance_s=1.0)
    assert wait(bedrock, at_max)["status"] == "Completed"
    assert {e["batch_id"] for e in admin.ledger()} == {at_max.rsplit("/", 1)[-1]}  # the failed job bills nothing
    load = admin.load()
    assert [(e["event"], e["jobs"]) for e in load_events(load, "bedrock")] == [
        ("enqueue", 1),
        ("refuse", 1),
        ("release", 0),
    ]


@pytest.mark.parametrize("body", [None, b'{"recordId": "x"}\n'], ids=["missing", "not-records"])
def test_a_missing_or_unreadable_input_ends_failed_through_validating(aws, admin, body):
    bedrock, s3, bucket = aws
    key = "in/nowhere.jsonl"
    if body is not None:
        s3.put_object(Bucket=bucket, Key=key, Body=body)
    admin.clock(freeze=True)
    arn = create(bedrock, f"s3://{bucket}/{key}", bucket)  # a jobArn, not a create-time ValidationException
    assert bedrock.get_model_invocation_job(jobIdentifier=arn)["status"] == "Submitted"
    admin.clock(advance_s=THIRD * 1.5)
    assert bedrock.get_model_invocation_job(jobIdentifier=arn)["status"] == "Validating"
    admin.clock(advance_s=THIRD)
    job = bedrock.get_model_invocation_job(jobIdentifier=arn)
    expected = "Unable to read the input at s3://" if body is None else "The input is not valid JSONL records"
    assert job["status"] == "Failed" and job["message"].startswith(expected) and "endTime" in job
    assert admin.ledger() == []
    events = load_events(admin.load(), "bedrock")
    assert [(e["event"], e["jobs"]) for e in events] == [("enqueue", 1), ("release", 0)]
