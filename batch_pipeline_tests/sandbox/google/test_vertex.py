"""The sandbox's Vertex AI batch prediction API through the real google-genai SDK (vertexai=True), reading and
writing a loopback GCS emulator through google-cloud-storage: shapes the SDK parses, auth, faults, lifecycle,
predictions on GCS and the ledger."""

import json
import time

import pytest
from google import genai
from google.cloud import storage
from google.genai import errors as genai_errors
from google.genai import types as gtypes
from google.oauth2.credentials import Credentials

from batch_pipeline.sandbox import SandboxAdmin, start_sandbox_process, stop_sandbox_process

BUCKET = "vertex-sandbox-tests"
REQUEST = {
    "contents": [{"role": "user", "parts": [{"text": "My invoice is wrong."}]}],
    "generationConfig": {
        "maxOutputTokens": 32,
        "responseMimeType": "application/json",
        "responseJsonSchema": {
            "type": "object",
            "properties": {"label": {"type": "string", "enum": ["billing", "bug"]}},
            "required": ["label"],
        },
    },
}


def client(url: str, *, project: str = "proj", token: str = "t", version: str | None = None) -> genai.Client:
    options: dict = {"base_url": url}
    if version:
        options["api_version"] = version
    return genai.Client(
        vertexai=True,
        project=project,
        location="us-central1",
        credentials=Credentials(token=token),
        http_options=options,
    )


@pytest.fixture
def gcs(vertex_sandbox) -> storage.Client:
    gcs = storage.Client(project="p")
    if gcs.lookup_bucket(BUCKET) is None:
        gcs.create_bucket(BUCKET)
    return gcs


def put_input(gcs: storage.Client, name: str, requests: list[dict]) -> str:
    data = "".join(json.dumps({"request": r}) + "\n" for r in requests)
    gcs.bucket(BUCKET).blob(name).upload_from_string(data)
    return f"gs://{BUCKET}/{name}"


def wait(c: genai.Client, name: str) -> gtypes.BatchJob:
    for _ in range(200):
        job = c.batches.get(name=name)
        if job.state.name in (
            "JOB_STATE_SUCCEEDED",
            "JOB_STATE_PARTIALLY_SUCCEEDED",
            "JOB_STATE_FAILED",
            "JOB_STATE_CANCELLED",
            "JOB_STATE_EXPIRED",
        ):
            return job
        time.sleep(0.05)
    raise AssertionError("the job never ended")


def predictions(gcs: storage.Client, job: gtypes.BatchJob) -> list[dict]:
    bucket, _, prefix = job.output_info.gcs_output_directory[5:].partition("/")
    blobs = [b for b in gcs.list_blobs(bucket, prefix=prefix + "/") if b.name.endswith(".jsonl")]
    assert [b.name.rsplit("/", 1)[-1] for b in blobs] == ["predictions.jsonl"]
    return [json.loads(line) for line in blobs[0].download_as_bytes().splitlines()]


def test_a_job_reads_its_input_from_gcs_and_writes_predictions_and_stats_the_sdk_parses(vertex_sandbox, gcs):
    c = client(vertex_sandbox.base_url)
    poison = {**REQUEST, "contents": [{"role": "user", "parts": [{"text": "bad [[sandbox:poison]]"}]}]}
    src = put_input(gcs, "a/input.jsonl", [REQUEST, poison, REQUEST])
    job = c.batches.create(
        model="gemini-2.5-flash", src=src, config={"display_name": "job:s1:1", "dest": f"gs://{BUCKET}/a/out"}
    )
    assert job.state == gtypes.JobState.JOB_STATE_PENDING and job.display_name == "job:s1:1"
    assert job.model == "publishers/google/models/gemini-2.5-flash" and job.src.gcs_uri == [src]
    done = wait(c, job.name)
    assert done.state == gtypes.JobState.JOB_STATE_SUCCEEDED and done.end_time >= done.start_time >= done.create_time
    stats = done.completion_stats
    assert (stats.successful_count, stats.failed_count, stats.incomplete_count) == (2, 1, 0)
    assert done.output_info.gcs_output_directory.startswith(f"gs://{BUCKET}/a/out/prediction-model-")
    lines = predictions(gcs, done)
    assert len(lines) == 3 and all({"status", "processed_time", "request"} <= set(line) for line in lines)
    ok = [line for line in lines if not line["status"]]
    bad = [line for line in lines if line["status"]]
    assert len(ok) == 2 and all(line["request"] == REQUEST for line in ok)
    response = gtypes.GenerateContentResponse.model_validate(ok[0]["response"])  # the SDK's own type
    assert json.loads(response.text)["label"] in ("billing", "bug")
    assert response.usage_metadata.prompt_token_count > 0
    assert bad[0]["status"].startswith("Bad Request: ")
    assert json.loads(bad[0]["status"].split(": ", 1)[1])["error"]["status"] == "INVALID_ARGUMENT"
    assert len(vertex_sandbox.ledger()) == 2  # only answered requests are billed


def test_list_filters_on_display_name_and_pages_and_v1_is_served_too(vertex_sandbox, gcs):
    c = client(vertex_sandbox.base_url)
    src = put_input(gcs, "b/input.jsonl", [REQUEST])
    for key in ("k:1", "k:2", "k:1"):
        c.batches.create(model="gemini-2.5-flash", src=src, config={"display_name": key, "dest": f"gs://{BUCKET}/b"})
    named = list(c.batches.list(config={"filter": 'display_name="k:1"', "page_size": 1}))
    assert [j.display_name for j in named] == ["k:1", "k:1"]  # two pages of one
    v1, other = client(vertex_sandbox.base_url, version="v1"), client(vertex_sandbox.base_url, project="other")
    assert len(list(v1.batches.list())) == 3
    assert list(other.batches.list()) == []
    with pytest.raises(genai_errors.APIError) as error:
        list(c.batches.list(config={"filter": 'state="JOB_STATE_RUNNING"'}))
    assert error.value.code == 400


def test_cancel_keeps_processed_rows_and_delete_waits_for_the_end(vertex_sandbox, gcs):
    vertex_sandbox.set_scenario("slow", in_progress_s=30.0)
    c = client(vertex_sandbox.base_url)
    job = c.batches.create(
        model="gemini-2.5-flash",
        src=put_input(gcs, "c/input.jsonl", [REQUEST] * 10),
        config={"dest": f"gs://{BUCKET}/c"},
    )
    vertex_sandbox.clock(freeze=True)  # cancelling lasts 0.05 s of sandbox time: none passes until we advance it
    with pytest.raises(genai_errors.APIError) as error:
        c.batches.delete(name=job.name)
    assert error.value.code == 400
    c.batches.cancel(name=job.name)
    assert c.batches.get(name=job.name).state == gtypes.JobState.JOB_STATE_CANCELLING
    vertex_sandbox.clock(advance_s=1.0)  # past cancelling_s
    done = wait(c, job.name)
    assert done.state == gtypes.JobState.JOB_STATE_CANCELLED and done.completion_stats.incomplete_count > 0
    with pytest.raises(genai_errors.APIError) as error:
        c.batches.cancel(name=job.name)
    assert error.value.code == 400  # 400, not 409: already terminal
    c.batches.delete(name=job.name)
    with pytest.raises(genai_errors.APIError) as error:
        c.batches.get(name=job.name)
    assert error.value.code == 404


def test_partial_and_expire_scenarios_and_an_unreadable_input(vertex_sandbox, gcs):
    c = client(vertex_sandbox.base_url)
    src = put_input(gcs, "d/input.jsonl", [REQUEST] * 4)
    vertex_sandbox.set_scenario("partial", complete_share=0.5)
    partial = wait(c, c.batches.create(model="gemini-2.5-flash", src=src, config={"dest": f"gs://{BUCKET}/d"}).name)
    assert partial.state == gtypes.JobState.JOB_STATE_PARTIALLY_SUCCEEDED
    assert (partial.completion_stats.successful_count, partial.completion_stats.incomplete_count) == (2, 2)
    assert len(predictions(gcs, partial)) == 2
    vertex_sandbox.set_scenario("expire", complete_share=0.25)
    expired = wait(c, c.batches.create(model="gemini-2.5-flash", src=src, config={"dest": f"gs://{BUCKET}/e"}).name)
    assert expired.state == gtypes.JobState.JOB_STATE_EXPIRED and len(predictions(gcs, expired)) == 1
    vertex_sandbox.set_scenario("normal")
    missing = c.batches.create(
        model="gemini-2.5-flash", src=f"gs://{BUCKET}/nothing-here.jsonl", config={"dest": f"gs://{BUCKET}/f"}
    )
    failed = wait(c, missing.name)
    assert failed.state == gtypes.JobState.JOB_STATE_FAILED and "Failed to read the input" in failed.error.message
    assert failed.output_info is None


def test_auth_permission_model_and_rate_limit_answers(vertex_sandbox, gcs):
    src = put_input(gcs, "g/input.jsonl", [REQUEST])
    config = {"dest": f"gs://{BUCKET}/g"}
    cases = [
        (client(vertex_sandbox.base_url, token="sandbox-bad"), "gemini-2.5-flash", 401, "UNAUTHENTICATED"),
        (client(vertex_sandbox.base_url, project="denied-p"), "gemini-2.5-flash", 403, "PERMISSION_DENIED"),
        (client(vertex_sandbox.base_url), "unknown-model", 404, "NOT_FOUND"),
    ]
    for c, model, code, status in cases:
        with pytest.raises(genai_errors.APIError) as error:
            c.batches.create(model=model, src=src, config=config)
        assert (error.value.code, error.value.status) == (code, status)
    vertex_sandbox.set_scenario("rate_limit", times=1, retry_after_ms=1500, on=["vertex_create"])
    limited = client(vertex_sandbox.base_url)  # held: a Client closes its connection pool when collected
    with pytest.raises(genai_errors.APIError) as error:
        limited.batches.create(model="gemini-2.5-flash", src=src, config=config)
    assert error.value.code == 429 and error.value.status == "RESOURCE_EXHAUSTED"
    retry = [d for d in error.value.details["error"]["details"] if d["@type"].endswith("RetryInfo")]
    assert retry == [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "1.5s"}]
    assert vertex_sandbox.ledger() == []


def test_without_a_gcs_emulator_the_sandbox_starts_its_own(vertex_sandbox, gcs_emulator):
    """No emulator named (a fresh `batch-pipeline sandbox`): the sandbox starts one in memory on first use, says
    where at GET /_sandbox/gcs, and reads job inputs from it (a missing object is named, not the emulator)."""
    import json
    import urllib.request

    proc, url = start_sandbox_process(env={"STORAGE_EMULATOR_HOST": "", "BATCH_PIPELINE_SANDBOX_GCS_URL": ""})
    try:
        SandboxAdmin(url).reset()
        with urllib.request.urlopen(url + "/_sandbox/gcs", timeout=30) as answer:
            own = json.loads(answer.read())["gcs_endpoint_url"]
        assert own.startswith("http://127.0.0.1:") and own.rstrip("/") != gcs_emulator.rstrip("/")
        c = client(url)
        job = c.batches.create(model="gemini-2.5-flash", src="gs://b/in.jsonl", config={"dest": "gs://b/o"})
        failed = wait(c, job.name)  # read from the sandbox's own emulator, where no such object exists
        assert failed.state == gtypes.JobState.JOB_STATE_FAILED and "Failed to read the input" in failed.error.message
    finally:
        stop_sandbox_process(proc)
