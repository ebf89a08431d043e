"""The Bedrock batch executor with real boto3 (``bedrock`` + ``s3``) over HTTP against the sandbox and its S3."""

import json
import logging

import botocore.session
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from batch_pipeline.core.errors import ConfigError, ErrorClass, SystemicError, TransientError, classify_line_error
from batch_pipeline.core.ledger.executor import BatchHandle, BatchState, RequestPlan, ShardWork
from batch_pipeline.core.quality.validate import validate
from batch_pipeline.core.spec.job import BackendSpec
from batch_pipeline.core.spec.loading import parse_spec
from batch_pipeline.executors.bedrock.batch import STATUS_MAP, BedrockBatchExecutor, job_name, request_token
from batch_pipeline.executors.bedrock.format import BEDROCK_RAW_SCHEMA
from batch_pipeline.executors.registry import batch_limits, batch_minimum, create_executor, names

from ..conftest import wait_ended

MODEL = "anthropic.claude-3-5-haiku-20241022-v1:0"
LABELS = ["billing", "bug", "other"]
SPEC = f"""
name: br
input: {{path: in.jsonl, text_field: body}}
prompt: {{version: v1, system: "Label the support ticket.", template: "{{body}}"}}
model: {MODEL}
backend: {{name: bedrock_batch, settings: {{sandbox: true}}}}
sampling: {{max_tokens: 16}}
output: {{choice: {LABELS}}}
"""
CREATE = ("POST", "/model-invocation-job")


def work(n: int = 120, attempt: int = 1, prompts: list[str] | None = None) -> ShardWork:
    prompts = prompts or [f"ticket {i}: a billing question" if i % 2 else f"ticket {i}: app bug" for i in range(n)]
    items = pa.table({"request_id": [f"{i:064x}" for i in range(len(prompts))], "user_prompt": prompts})
    return ShardWork("br", "s00001", attempt, f"br:s00001:{attempt}", RequestPlan.from_spec(parse_spec(SPEC)), items)


def executor(**settings) -> BedrockBatchExecutor:
    ex = create_executor(BackendSpec(name="bedrock_batch", settings={"sandbox": True, **settings}))
    assert isinstance(ex, BedrockBatchExecutor)
    return ex


def creates(admin) -> list[dict]:
    return [r for r in admin.requests() if (r["method"], r["path"]) == CREATE]


def fetch_all(ex: BedrockBatchExecutor, handle: BatchHandle) -> pa.Table:
    tables = list(ex.fetch(handle))
    assert tables and all(t.schema == BEDROCK_RAW_SCHEMA for t in tables)
    return pa.concat_tables(tables)


def test_registered_with_its_limits_and_its_minimum():
    assert "bedrock_batch" in names() and batch_limits("bedrock_batch") == (50_000, 2**30)
    assert batch_minimum(BackendSpec(name="bedrock_batch", settings={"sandbox": True})) == 100
    assert batch_minimum(BackendSpec(name="bedrock_batch", settings={"sandbox": True, "min_records": 1000})) == 1000
    assert batch_minimum(BackendSpec(name="openai_batch")) == 0


def test_outside_the_sandbox_the_role_and_the_buckets_are_required(monkeypatch):
    monkeypatch.delenv("BATCH_PIPELINE_SANDBOX_URL", raising=False)
    with pytest.raises(ConfigError, match="role_arn is required"):
        create_executor(BackendSpec(name="bedrock_batch", settings={"s3_uri": "s3://b/p"}))
    with pytest.raises(ConfigError, match="give s3_uri, or input_bucket and output_bucket"):
        create_executor(BackendSpec(name="bedrock_batch", settings={"role_arn": "arn:aws:iam::1:role/r"}))
    with pytest.raises(ConfigError, match="api_key_env"):  # credentials never come from the spec
        create_executor(BackendSpec(name="bedrock_batch", settings={"sandbox": True, "api_key_env": "AWS_SECRET"}))


def test_executors_share_botocore_s_loader_and_keep_their_own_region_and_credentials(admin, monkeypatch):
    """Made per step, each executor parsed botocore's service models again (~100 ms); the loader is shared, the
    session's region and credential chain are each executor's own."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDFROMTHEENVIRONMENT")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-a-secret")
    live = {"role_arn": "arn:aws:iam::1:role/r", "s3_uri": "s3://b/p"}
    east = executor()
    west = create_executor(BackendSpec(name="bedrock_batch", settings={**live, "region": "us-west-2"}))
    assert isinstance(west, BedrockBatchExecutor)
    loaders = {id(ex.session._session.get_component("data_loader")) for ex in (east, west, executor())}
    assert len(loaders) == 1
    assert (east.client.meta.region_name, west.client.meta.region_name) == ("us-east-1", "us-west-2")
    assert west.session.get_credentials().access_key == "AKIDFROMTHEENVIRONMENT"
    assert east.session.get_credentials().access_key != "AKIDFROMTHEENVIRONMENT"  # the sandbox's own


def test_every_bedrock_status_is_mapped():
    model = botocore.session.get_session().get_service_model("bedrock")
    assert set(STATUS_MAP) == set(model.shape_for("ModelInvocationJobStatus").enum)
    assert STATUS_MAP["PartiallyCompleted"] == BatchState.EXPIRED and STATUS_MAP["Stopped"] == BatchState.CANCELLED


def test_submit_writes_bedrock_messages_records_to_s3_and_the_answers_validate(admin):
    ex = executor()
    w = work()
    handle = ex.submit(w)
    assert handle.batch_id.startswith("arn:aws:bedrock:us-east-1:") and handle.input_file_id.endswith(".jsonl")
    bucket, _, key = handle.input_file_id[len("s3://") :].partition("/")
    lines = [json.loads(line) for line in ex.s3.get_object(Bucket=bucket, Key=key)["Body"].read().splitlines()]
    assert [line["recordId"] for line in lines] == w.request_ids
    model_input = lines[0]["modelInput"]
    assert model_input["anthropic_version"] == "bedrock-2023-05-31" and "model" not in model_input
    assert model_input["system"] == "Label the support ticket." and model_input["max_tokens"] == 16
    assert model_input["tool_choice"] == {"type": "tool", "name": "answer"}  # the output contract, as on Anthropic
    assert model_input["messages"] == [{"role": "user", "content": w.items.column("user_prompt")[0].as_py()}]
    (create,) = creates(admin)
    assert create["status"] == 200
    status = wait_ended(ex, handle)
    assert (status.state, status.provider_status, status.total, status.completed) == (
        BatchState.COMPLETED,
        "Completed",
        120,
        120,
    )
    raw = fetch_all(ex, handle)
    assert sorted(raw.column("request_id").to_pylist()) == sorted(w.request_ids)
    verdicts = validate(raw, parse_spec(SPEC).output)
    assert set(verdicts.status.to_pylist()) == {"succeeded"}
    assert set(verdicts.parsed_output.to_pylist()) <= set(LABELS)
    billed = admin.ledger()
    assert sorted(e["custom_id"] for e in billed) == sorted(w.request_ids)
    assert sum(raw.column("input_tokens").to_pylist()) == sum(e["input_tokens"] for e in billed)


def test_a_retried_create_is_the_same_job(admin):
    # the first create is carried out but answered 500: botocore retries with the same clientRequestToken
    admin.set_scenario("server_error", on=["bedrock_create"], times=1, commit=True)
    ex = executor()
    handle = ex.submit(work())
    calls = creates(admin)
    assert [c["status"] for c in calls] == [500, 200]
    jobs = ex.client.list_model_invocation_jobs()["invocationJobSummaries"]
    assert [j["jobArn"] for j in jobs] == [handle.batch_id]
    assert jobs[0]["clientRequestToken"] == request_token("br:s00001:1") and jobs[0]["jobName"] == "br-s00001-1"
    # a whole new submit of the same attempt (a resumed run) is still that job
    assert ex.submit(work()).batch_id == handle.batch_id
    wait_ended(ex, handle)
    assert len(admin.ledger()) == 120


def test_throttling_is_waited_out_not_failed(admin):
    admin.set_scenario("rate_limit", on=["bedrock_create", "bedrock_get"], times=2, retry_after_ms=20)
    ex = executor()
    handle = ex.submit(work())
    assert wait_ended(ex, handle).state == BatchState.COMPLETED
    statuses = [r["status"] for r in admin.requests() if r["path"].startswith("/model-invocation-job")]
    assert statuses.count(429) == 4 and [c["status"] for c in creates(admin)] == [429, 429, 200]


def test_spent_retries_on_429_are_transient(admin):
    admin.set_scenario("rate_limit", on=["bedrock_create"], times=50, retry_after_ms=1)
    with pytest.raises(TransientError, match="ThrottlingException") as caught:
        executor(max_retries=1).submit(work())
    assert caught.value.code == "ThrottlingException"
    assert admin.ledger() == []


@pytest.mark.parametrize(
    ("scenario", "code", "hint"),
    [
        ("access_denied", "access_denied", "role_arn"),
        ("unknown_model", "model_not_found", "unknown model"),
        ("no_credit", "access_denied", "INVALID_PAYMENT_INSTRUMENT"),
    ],
)
def test_account_and_model_errors_are_systemic(admin, scenario, code, hint):
    admin.set_scenario(scenario)
    with pytest.raises(SystemicError) as caught:
        executor().submit(work())
    assert caught.value.code == code and hint in str(caught.value)
    assert [c["status"] for c in creates(admin)] == [403 if scenario != "unknown_model" else 400]  # not retried


def test_a_shard_below_the_minimum_never_reaches_create(admin):
    with pytest.raises(ConfigError, match="below the minimum of 100"):
        executor().submit(work(n=99))
    assert creates(admin) == [] and not [r for r in admin.requests() if r["path"].startswith("/model-invocation")]


def test_the_service_refuses_a_job_below_its_own_minimum(admin):
    # an account quota set too low in the spec: Bedrock answers ValidationException, which stops (no retry)
    with pytest.raises(SystemicError, match="below the minimum of 100 records") as caught:
        executor(min_records=10).submit(work(n=20))
    assert caught.value.code == "ValidationException" and [c["status"] for c in creates(admin)] == [400]


def test_find_reattaches_by_job_name_after_a_crash(admin):
    handle = executor().submit(work())
    fresh = executor()  # a new process: nothing in memory
    found = fresh.find("br:s00001:1")
    assert found is not None and found.batch_id == handle.batch_id and found.input_file_id == handle.input_file_id
    # a name that merely contains ours (attempt 10 vs attempt 1) is not ours
    assert fresh.find("br:s00001:10") is None and job_name("br:s00001:10").startswith(job_name("br:s00001:1"))
    assert len(creates(admin)) == 1


def test_stop_keeps_what_was_processed(admin):
    admin.set_scenario("normal", in_progress_s=30.0, cancelling_s=0.2)
    ex = executor()
    handle = ex.submit(work())
    admin.clock(advance_s=0.05 + 12.0)  # about 40% processed
    ex.cancel(handle)
    assert ex.poll(handle).provider_status == "Stopping"
    status = wait_ended(ex, handle)
    assert (status.state, status.provider_status) == (BatchState.CANCELLED, "Stopped")
    raw = fetch_all(ex, handle)
    assert 0 < raw.num_rows < 120 and set(raw.column("http_status").to_pylist()) == {200}
    assert len(admin.ledger()) == raw.num_rows
    ex.cancel(handle)  # stopping an ended job is not an error


def test_every_live_status_is_seen_on_a_slow_clock(admin):
    admin.set_scenario("normal", validating_s=3.0, in_progress_s=3.0, finalizing_s=1.0)
    admin.clock(freeze=True)
    ex = executor()
    handle = ex.submit(work())
    admin.clock(advance_s=0.5)  # poll between the boundaries (each a third of validating_s, then 3 s, then 1 s)
    seen = []
    for _ in range(9):
        status = ex.poll(handle)
        seen.append((status.provider_status, status.state))
        admin.clock(advance_s=1.0)
    assert [s for s, _ in seen] == [
        "Submitted",
        "Validating",
        "Scheduled",
        "InProgress",
        "InProgress",
        "InProgress",
        "InProgress",
        "Completed",
        "Completed",
    ]
    assert {s: st for s, st in seen} == {
        "Submitted": BatchState.VALIDATING,
        "Validating": BatchState.VALIDATING,
        "Scheduled": BatchState.VALIDATING,
        "InProgress": BatchState.RUNNING,
        "Completed": BatchState.COMPLETED,
    }


def test_a_timeout_mid_run_is_partially_completed_with_partial_results(admin):
    admin.set_scenario("expire", complete_share=0.4)
    ex = executor()
    handle = ex.submit(work())
    status = wait_ended(ex, handle)
    assert (status.state, status.provider_status) == (BatchState.EXPIRED, "PartiallyCompleted")
    raw = fetch_all(ex, handle)
    assert raw.num_rows == 48 and len(admin.ledger()) == 48  # the rest have no line: they stay pending


def test_a_job_that_never_started_expires_with_nothing(admin):
    admin.set_scenario("expire", complete_share=0.0)
    ex = executor()
    handle = ex.submit(work())
    status = wait_ended(ex, handle)
    assert (status.state, status.provider_status) == (BatchState.EXPIRED, "Expired")
    assert list(ex.fetch(handle)) == [] and admin.ledger() == []


def test_a_failed_validation_is_failed_with_its_message(admin):
    admin.set_scenario("fail_validation")
    ex = executor()
    status = wait_ended(ex, ex.submit(work()))
    assert status.state == BatchState.FAILED and "fail_validation" in status.errors[0]


def test_line_errors_are_joined_on_record_id_and_classified(admin):
    admin.set_scenario("line_errors", rate=0.3)
    ex = executor()
    handle = ex.submit(work())
    status = wait_ended(ex, handle)
    raw = fetch_all(ex, handle)
    failed = raw.filter(pc.not_equal(raw.column("http_status"), 200))
    assert status.state == BatchState.COMPLETED and status.failed == failed.num_rows > 0
    assert set(failed.column("error_code").to_pylist()) == {"InternalServerException"}
    assert {
        classify_line_error(c, s)
        for c, s in zip(failed.column("error_code").to_pylist(), failed.column("http_status").to_pylist())
    } == {ErrorClass.TRANSIENT}
    assert all(
        json.loads(p)["recordId"] == r
        for p, r in zip(raw.column("raw_payload").to_pylist(), raw.column("request_id").to_pylist())
    )


def test_a_manifest_that_disagrees_with_the_output_is_logged(admin, caplog):
    ex = executor()
    handle = ex.submit(work())
    wait_ended(ex, handle)
    with caplog.at_level(logging.INFO, logger="batch_pipeline.executors.bedrock.batch"):
        fetch_all(ex, handle)
    assert "manifest.json.out matches the output (120 records, 120 succeeded)" in caplog.text
    job = ex.client.get_model_invocation_job(jobIdentifier=handle.batch_id)
    bucket, _, prefix = job["outputDataConfig"]["s3OutputDataConfig"]["s3Uri"][5:].partition("/")
    key = f"{prefix.rstrip('/')}/{handle.batch_id.rsplit('/', 1)[-1]}/manifest.json.out"
    manifest = json.loads(ex.s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    ex.s3.put_object(Bucket=bucket, Key=key, Body=json.dumps({**manifest, "successRecordCount": 121}).encode())
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="batch_pipeline.executors.bedrock.batch"):
        fetch_all(ex, handle)
    assert "does not match the output read: successRecordCount 121 in the manifest, 120 here" in caplog.text


def test_an_unknown_job_is_a_systemic_error(admin):
    with pytest.raises(SystemicError, match="HTTP 404 ResourceNotFoundException"):
        executor().poll(
            BatchHandle(
                "bedrock_batch",
                "arn:aws:bedrock:us-east-1:123456789012:model-invocation-job/abcdefabcdef",
                "br:s00001:1",
            )
        )


def test_a_non_claude_model_is_refused_before_anything_is_sent(admin):
    w = work()
    w.plan = RequestPlan("meta.llama3-1-8b-instruct-v1:0", w.plan.system, w.plan.sampling, w.plan.output)
    with pytest.raises(ConfigError, match="only Anthropic Claude models"):
        executor().submit(w)
    assert [r["path"] for r in admin.requests() if not r["path"].startswith("/_sandbox")] == []
