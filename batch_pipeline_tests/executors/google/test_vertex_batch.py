"""vertex_batch through the real google-genai SDK (vertexai=True) and google-cloud-storage, against the sandbox
and a loopback GCS emulator: every state, labels carried through, partial results, cancel, re-attach, faults."""

import hashlib
import json

import pyarrow as pa
import pytest
from google.cloud import storage
from google.genai import types as gtypes

from batch_pipeline.core.errors import ConfigError, ErrorClass, SystemicError, classify_line_error
from batch_pipeline.core.ledger.executor import BatchState, RequestPlan, ShardWork
from batch_pipeline.core.spec.job import BackendSpec, OutputSpec, SamplingSpec
from batch_pipeline.executors.google.gcs import parse_gs_uri
from batch_pipeline.executors.google.vertex_batch import (
    STATE_MAP,
    VertexBatchExecutor,
    VertexBatchSettings,
    retry_delay_s,
)
from batch_pipeline.executors.google.vertex_lines import (
    ID_LABEL,
    content_index,
    decode_id,
    encode_id,
    parse_predictions_block,
    request_lines,
)
from batch_pipeline.executors.registry import create_executor

from ..conftest import wait_ended

LABELS = ["billing", "bug", "other"]
PLAN = RequestPlan(
    model="gemini-2.5-flash",
    system="Label the ticket.",
    sampling=SamplingSpec(temperature=0, max_tokens=16),
    output=OutputSpec(choice=LABELS),
)


def work(n: int = 6, key: str = "job:s00001:1", marker: dict[int, str] | None = None) -> ShardWork:
    ids = [hashlib.sha256(f"{key}-{i}".encode()).hexdigest() for i in range(n)]
    prompts = [f"ticket {i} about my invoice" + ((marker or {}).get(i) or "") for i in range(n)]
    job, shard, attempt = key.split(":")
    return ShardWork(job, shard, int(attempt), key, PLAN, pa.table({"request_id": ids, "user_prompt": prompts}))


def executor(**settings) -> VertexBatchExecutor:
    ex = create_executor(BackendSpec(name="vertex_batch", settings={"sandbox": True, "max_retries": 3, **settings}))
    assert isinstance(ex, VertexBatchExecutor)
    return ex


def rows(ex, handle) -> list[dict]:
    return [r for t in ex.fetch(handle) for r in t.to_pylist()]


def test_a_job_writes_labelled_input_to_gcs_and_every_answer_comes_back_matched(vertex_sandbox, gcs_emulator):
    ex, w = executor(), work()
    handle = ex.submit(w)
    assert handle.batch_id.startswith("projects/sandbox-project/locations/us-central1/batchPredictionJobs/")
    bucket, name = parse_gs_uri(handle.input_file_id)
    lines = [
        json.loads(line)
        for line in storage.Client(project="p").bucket(bucket).blob(name).download_as_bytes().splitlines()
    ]
    assert all(set(line) == {"request"} for line in lines)  # no key field: Vertex lines have none
    assert [decode_id(line["request"]["labels"][ID_LABEL]) for line in lines] == w.request_ids
    assert lines[0]["request"]["generationConfig"]["responseMimeType"] == "application/json"
    status = wait_ended(ex, handle)
    assert status.state == BatchState.COMPLETED and status.provider_status == "JOB_STATE_SUCCEEDED"
    assert (status.total, status.completed, status.failed) == (6, 6, 0)
    got = rows(ex, handle)
    assert sorted(r["request_id"] for r in got) == sorted(w.request_ids)
    assert {json.loads(r["output_text"])["label"] for r in got} <= set(LABELS)
    assert all(r["http_status"] == 200 and r["finish_reason"] == "stop" and r["input_tokens"] > 0 for r in got)
    assert all(json.loads(r["raw_payload"])["status"] == "" for r in got)  # the provider line, verbatim
    billed = vertex_sandbox.ledger()
    assert sorted(e["custom_id"] for e in billed) == sorted(w.request_ids)
    assert {e["provider"] for e in billed} == {"vertex"}


def test_failed_lines_carry_the_google_status_and_truncation_and_refusal_are_told_apart(vertex_sandbox):
    ex = executor()
    w = work(marker={1: " [[sandbox:poison]]", 2: " [[sandbox:truncate]]", 3: " [[sandbox:refuse]]"})
    handle = ex.submit(w)
    assert wait_ended(ex, handle).failed == 1
    by_id = {r["request_id"]: r for r in rows(ex, handle)}
    poison, truncated, refused = (by_id[w.request_ids[i]] for i in (1, 2, 3))
    assert poison["http_status"] == 400 and poison["error_code"] == "invalid_argument"
    assert classify_line_error(poison["error_code"], poison["http_status"]) == ErrorClass.POISON
    assert truncated["finish_reason"] == "length"
    assert refused["finish_reason"] == "refusal" and refused["output_text"] is None
    assert len(vertex_sandbox.ledger()) == 5  # the failed request is not billed


def test_partially_succeeded_is_an_ended_batch_whose_missing_requests_stay_pending(vertex_sandbox):
    vertex_sandbox.set_scenario("partial", complete_share=0.5)
    ex, w = executor(), work(8)
    handle = ex.submit(w)
    status = wait_ended(ex, handle)
    assert status.state == BatchState.COMPLETED and status.provider_status == "JOB_STATE_PARTIALLY_SUCCEEDED"
    assert (status.total, status.completed, status.failed) == (8, 4, 4)  # 4 incomplete count as not done
    got = rows(ex, handle)
    assert len(got) == 4 and set(r["request_id"] for r in got) < set(w.request_ids)
    assert len(vertex_sandbox.ledger()) == 4


def test_an_expired_job_keeps_the_rows_it_finished(vertex_sandbox):
    vertex_sandbox.set_scenario("expire", complete_share=0.25)
    ex = executor()
    handle = ex.submit(work(8))
    status = wait_ended(ex, handle)
    assert status.state == BatchState.EXPIRED and status.provider_status == "JOB_STATE_EXPIRED"
    assert len(rows(ex, handle)) == 2


def test_cancel_ends_the_job_cancelled_and_a_second_cancel_after_the_end_is_quiet(vertex_sandbox):
    vertex_sandbox.set_scenario("slow", in_progress_s=30.0)
    ex = executor()
    handle = ex.submit(work(20))
    ex.cancel(handle)
    status = wait_ended(ex, handle)
    assert status.state == BatchState.CANCELLED and status.provider_status == "JOB_STATE_CANCELLED"
    assert len(rows(ex, handle)) < 20
    ex.cancel(handle)  # already ended: nothing to cancel, no error


def test_find_reattaches_by_display_name_and_a_create_that_failed_in_transit_makes_one_job(vertex_sandbox):
    vertex_sandbox.set_scenario("server_error", times=1, on=["vertex_create"], commit=True)
    ex, w = executor(), work(key="job:s00002:3")
    handle = ex.submit(w)  # the first create made the job but answered 500: found by its display name
    assert ex.find("job:s00002:3") == handle
    assert ex.find("job:s00002:4") is None
    jobs = list(ex.client.batches.list(config={"page_size": 100}))
    assert [j.display_name for j in jobs] == ["job:s00002:3"]
    assert wait_ended(ex, handle).state == BatchState.COMPLETED


def test_a_429_is_waited_out_as_the_retry_info_asks(vertex_sandbox):
    vertex_sandbox.set_scenario("rate_limit", times=2, retry_after_ms=50, on=["vertex_create", "vertex_get"])
    ex = executor()
    handle = ex.submit(work(3))
    assert wait_ended(ex, handle).state == BatchState.COMPLETED
    creates = [
        r["status"]
        for r in vertex_sandbox.requests()
        if r["path"].endswith("/batchPredictionJobs") and r["method"] == "POST"
    ]
    assert creates == [429, 429, 200]


def test_permission_denied_and_an_unknown_model_are_systemic_and_not_retried(vertex_sandbox):
    denied = executor(project="denied-proj")
    with pytest.raises(SystemicError) as error:
        denied.submit(work())
    assert error.value.code == "permission_denied" and "aiplatform.batchPredictionJobs.create" in str(error.value)
    vertex_sandbox.set_scenario("unknown_model")
    with pytest.raises(SystemicError) as error:
        executor().submit(work())
    assert error.value.code == "model_not_found"
    creates = [r for r in vertex_sandbox.requests() if r["method"] == "POST" and "batchPredictionJobs" in r["path"]]
    assert [r["status"] for r in creates] == [403, 404]


def test_sandbox_without_a_gcs_emulator_and_real_service_without_a_bucket_are_config_errors(
    vertex_sandbox, gcs_emulator, monkeypatch
):
    monkeypatch.delenv("STORAGE_EMULATOR_HOST")
    # no emulator named here: the executor asks the sandbox for the one behind its jobs (this fixture's)
    assert executor().gcs.client._connection.API_BASE_URL.rstrip("/") == gcs_emulator.rstrip("/")
    monkeypatch.setenv("BATCH_PIPELINE_SANDBOX_URL", "http://127.0.0.1:9")  # nothing listens there
    with pytest.raises(ConfigError, match="did not say where the GCS emulator behind its Vertex jobs is"):
        executor()
    with pytest.raises(ConfigError, match="bucket is required"):
        create_executor(BackendSpec(name="vertex_batch", settings={}))
    with pytest.raises(ConfigError, match="needs a project"):
        create_executor(BackendSpec(name="vertex_batch", settings={"bucket": "b"}))


def test_every_job_state_is_mapped_and_an_unknown_one_is_an_error(vertex_sandbox):
    job_states = {s for s in gtypes.JobState if s.name.startswith("JOB_STATE_")}
    assert job_states - set(STATE_MAP) == {gtypes.JobState.JOB_STATE_UNSPECIFIED}
    ex = executor()
    with pytest.raises(Exception, match="unknown state"):
        ex._status(
            gtypes.BatchJob(
                name="projects/p/locations/l/batchPredictionJobs/1", state=gtypes.JobState.JOB_STATE_UNSPECIFIED
            )
        )


def test_request_ids_survive_the_label_alphabet_and_retry_info_is_read():
    rid = hashlib.sha256(b"x").hexdigest()
    label = encode_id(rid)
    assert len(label) <= 63 and set(label) <= set("abcdefghijklmnopqrstuvwxyz234567") and decode_id(label) == rid
    assert decode_id("not-base32!") is None and decode_id(None) is None
    with pytest.raises(ConfigError):
        encode_id("custom-id-1")
    body = {"error": {"details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "1.5s"}]}}
    assert retry_delay_s(body) == 1.5 and retry_delay_s({"error": {}}) is None


def test_settings_refuse_a_gs_uri_as_bucket():
    with pytest.raises(ValueError, match="bare bucket name"):
        VertexBatchSettings(bucket="gs://b/x")


def test_a_line_without_its_label_is_matched_on_its_echoed_contents_and_status_texts_are_parsed():
    w = work(3)
    index = content_index(request_lines(w))
    requests = [json.loads(line)["request"] for line in request_lines(w).splitlines()]
    answer = {
        "candidates": [{"content": {"role": "model", "parts": [{"text": '{"label": "bug"}'}]}, "finishReason": "STOP"}],
        "usageMetadata": {"promptTokenCount": 7, "candidatesTokenCount": 3},
    }
    unlabelled = {k: v for k, v in requests[0].items() if k != "labels"}
    lines = [
        {"status": "", "processed_time": "t", "request": unlabelled, "response": answer},
        {"status": "", "processed_time": "t", "request": requests[1], "response": answer},
        {
            "status": 'Too Many Requests: {"error": {"code": 429, "message": "slow down", '
            '"status": "RESOURCE_EXHAUSTED"}}',
            "processed_time": "t",
            "request": requests[2],
        },
        {"status": "Internal error without JSON", "processed_time": "t", "request": {"contents": []}},
    ]
    block = "".join(json.dumps(line) + "\n" for line in lines).encode()
    got = parse_predictions_block(block, index.get).to_pylist()
    assert [r["request_id"] for r in got[:3]] == w.request_ids
    assert got[0]["output_text"] == '{"label": "bug"}' and got[0]["input_tokens"] == 7
    assert (got[2]["http_status"], got[2]["error_code"]) == (429, "resource_exhausted")
    assert classify_line_error(got[2]["error_code"], got[2]["http_status"]) == ErrorClass.TRANSIENT
    assert got[3]["request_id"] is None and got[3]["http_status"] == 500  # matched by nothing: ignored by ID
    assert parse_predictions_block(block).column("request_id").to_pylist()[0] is None  # no index, no match
