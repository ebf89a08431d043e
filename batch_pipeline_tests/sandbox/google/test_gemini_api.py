"""The sandbox's Gemini API driven by the real google-genai SDK; every answer parsed with the SDK's own pydantic
types (File, BatchJob, GenerateContentResponse, JobError), as the OpenAI side is held to OpenAI's schemas."""

import base64
import hashlib
import io
import json
import time

import httpx2
import openai
import pytest
from google import genai
from google.genai import errors, types

SCHEMA = {
    "type": "object",
    "properties": {"label": {"type": "string", "enum": ["billing", "bug", "other"]}},
    "required": ["label"],
    "additionalProperties": False,
}
LONG_SYSTEM = "You label support tickets with one label: billing, bug or other. " * 80  # > 1024 tokens


def client(url: str, key: str = "any-key", **options) -> genai.Client:
    return genai.Client(api_key=key, http_options={"base_url": url, **options})


def jsonl(prompts: list[str], system: str = "Label the ticket.", max_tokens: int = 32) -> bytes:
    return b"".join(
        json.dumps(
            {
                "key": f"k{i}",
                "request": {
                    "contents": [{"role": "user", "parts": [{"text": p}]}],
                    "systemInstruction": {"parts": [{"text": system}]},
                    "generationConfig": {
                        "responseMimeType": "application/json",
                        "responseJsonSchema": SCHEMA,
                        "maxOutputTokens": max_tokens,
                    },
                },
            }
        ).encode()
        + b"\n"
        for i, p in enumerate(prompts)
    )


def upload(c: genai.Client, data: bytes) -> types.File:
    return c.files.upload(file=io.BytesIO(data), config={"mime_type": "jsonl", "display_name": "in.jsonl"})


def run(c: genai.Client, data: bytes, name: str = "job:s1:1") -> types.BatchJob:
    job = c.batches.create(model="gemini-2.5-flash", src=upload(c, data).name, config={"display_name": name})
    for _ in range(300):
        job = c.batches.get(name=job.name)
        if job.done:
            return job
        time.sleep(0.02)
    raise AssertionError("the batch never ended")


def result_lines(c: genai.Client, job: types.BatchJob) -> list[dict]:
    return [json.loads(line) for line in c.files.download(file=job.dest.file_name).splitlines()]


def test_upload_create_poll_download_with_the_sdk_and_its_types(admin, sandbox_proc):
    url = sandbox_proc[1]
    c = client(url)
    prompts = [
        "I was charged twice on my billing statement",
        "a bug: the app crashes on start",
        "hello there",
        "[[sandbox:truncate]] a bug",
        "[[sandbox:refuse]] billing",
        "[[sandbox:poison]] x",
        "[[sandbox:block]] y",
    ]
    f = upload(c, jsonl(prompts))
    assert f.name.startswith("files/") and f.size_bytes == len(jsonl(prompts)) and f.display_name == "in.jsonl"
    assert f.state == types.FileState.ACTIVE and f.source == types.FileSource.UPLOADED
    assert c.files.get(name=f.name).size_bytes == f.size_bytes
    job = c.batches.create(model="gemini-2.5-flash", src=f.name, config={"display_name": "job:s1:1"})
    assert job.state == types.JobState.JOB_STATE_PENDING and job.display_name == "job:s1:1"
    assert job.model == "models/gemini-2.5-flash" and job.create_time is not None
    job = run(c, jsonl(prompts), "job:s1:2")
    assert job.state == types.JobState.JOB_STATE_SUCCEEDED and job.end_time is not None and job.dest.file_name
    lines = result_lines(c, job)
    assert sorted(line["key"] for line in lines) == [f"k{i}" for i in range(len(prompts))]
    assert [line["key"] for line in lines] != sorted(line["key"] for line in lines)  # not input order
    by = {line["key"]: line for line in lines}
    for line in lines:
        assert set(line) in ({"key", "response"}, {"key", "error"})
        if "response" in line:
            parsed = types.GenerateContentResponse.model_validate(line["response"])
            assert parsed.usage_metadata.prompt_token_count > 0 and parsed.response_id
        else:
            types.JobError.model_validate(line["error"])
    first = types.GenerateContentResponse.model_validate(by["k0"]["response"])
    assert json.loads(first.text) == {"label": "billing"} and first.candidates[0].finish_reason == "STOP"
    assert json.loads(types.GenerateContentResponse.model_validate(by["k1"]["response"]).text) == {"label": "bug"}
    truncated = types.GenerateContentResponse.model_validate(by["k3"]["response"])
    assert truncated.candidates[0].finish_reason == types.FinishReason.MAX_TOKENS
    refused = types.GenerateContentResponse.model_validate(by["k4"]["response"])
    assert refused.candidates[0].finish_reason == types.FinishReason.SAFETY and refused.candidates[0].content is None
    assert by["k5"]["error"]["code"] == 3 and "status" not in by["k5"]["error"]  # google.rpc.Status: INVALID_ARGUMENT
    blocked = types.GenerateContentResponse.model_validate(by["k6"]["response"])
    assert blocked.prompt_feedback.block_reason == types.BlockedReason.SAFETY and not blocked.candidates
    ledger = admin.ledger()  # only answered requests are billed, once, when the batch ended
    assert {e["custom_id"] for e in ledger if e["batch_id"] == job.name} == {"k0", "k1", "k2", "k3", "k4", "k6"}
    assert {e["provider"] for e in ledger} == {"gemini"}


def test_operations_and_lists_parse_with_the_sdk_and_keep_what_it_drops(admin, sandbox_proc):
    url = sandbox_proc[1]
    c = client(url)
    jobs = [run(c, jsonl(["a bug"]), f"job:s{i}:1") for i in range(3)]
    listed = list(c.batches.list(config={"page_size": 2}))  # two pages
    assert [j.display_name for j in listed] == ["job:s2:1", "job:s1:1", "job:s0:1"]  # newest first
    raw = httpx2.get(f"{url}/v1/{jobs[0].name}", headers={"x-goog-api-key": "k"}).json()
    assert raw["done"] is True and raw["metadata"]["state"] == "BATCH_STATE_SUCCEEDED"
    assert raw["metadata"]["batchStats"] == {"requestCount": "1", "successfulRequestCount": "1"}  # no zeros
    assert raw["response"]["responsesFile"] == jobs[0].dest.file_name
    out = c.files.get(name=jobs[0].dest.file_name)
    assert out.source == types.FileSource.GENERATED and out.download_uri
    files = list(c.files.list())
    assert len(files) == 6 and all(isinstance(f, types.File) for f in files)
    c.batches.delete(name=jobs[0].name)
    with pytest.raises(errors.ClientError) as gone:
        c.batches.get(name=jobs[0].name)
    assert gone.value.code == 404 and gone.value.status == "NOT_FOUND"
    c.files.delete(name=out.name)
    with pytest.raises(errors.ClientError):
        c.files.download(file=out.name)


def test_v1beta_and_v1_both_served_and_openai_keeps_its_own_v1_paths(admin, sandbox_proc):
    url = sandbox_proc[1]
    beta = client(url, api_version="v1beta")
    job = run(beta, jsonl(["a bug"]))
    assert job.state == types.JobState.JOB_STATE_SUCCEEDED
    assert any(r["path"].startswith("/v1beta/batches/") for r in admin.requests())
    assert any(r["path"] == "/upload/v1beta/files" for r in admin.requests())
    oa = openai.OpenAI(base_url=url + "/v1", api_key="sk-sandbox")
    assert oa.batches.list().data == []  # the OpenAI batches list does not see Gemini's batches
    v1 = client(url)  # kept: a Client closes its connections when it is collected
    assert [j.name for j in v1.batches.list()] == [job.name]


def test_errors_come_in_googles_envelope(admin, sandbox_proc):
    url = sandbox_proc[1]
    bad_key = client(url, key="sk-sandbox-bad")
    with pytest.raises(errors.ClientError) as bad:
        bad_key.batches.list()
    assert (bad.value.code, bad.value.status) == (400, "INVALID_ARGUMENT")
    assert bad.value.details["error"]["details"][0]["reason"] == "API_KEY_INVALID"
    c = client(url)
    f = upload(c, jsonl(["x"]))
    with pytest.raises(errors.ClientError) as unknown:
        c.batches.create(model="unknown-model", src=f.name)
    assert unknown.value.code == 404 and "models/unknown-model" in unknown.value.message
    admin.set_scenario("no_credit")
    with pytest.raises(errors.ClientError) as broke:
        c.batches.create(model="gemini-2.5-flash", src=f.name)
    assert broke.value.code == 403 and broke.value.details["error"]["details"][0]["reason"] == "BILLING_DISABLED"
    admin.set_scenario("rate_limit", times=1, retry_after_ms=50, on=["gemini_list"])
    with pytest.raises(errors.ClientError) as limited:
        c.batches.list()
    assert limited.value.code == 429 and limited.value.status == "RESOURCE_EXHAUSTED"
    retry = [d for d in limited.value.details["error"]["details"] if d["@type"].endswith("RetryInfo")]
    assert retry == [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "0.05s"}]
    assert list(c.batches.list()) == []  # the scenario owed one 429
    with pytest.raises(errors.ClientError) as missing:
        c.batches.get(name="batches/nope")
    assert missing.value.code == 404


def test_an_upload_at_the_wrong_offset_is_refused(admin, sandbox_proc):
    url = sandbox_proc[1]
    start = httpx2.post(
        f"{url}/upload/v1/files",
        json={"file": {"displayName": "x"}},
        headers={
            "x-goog-api-key": "k",
            "x-goog-upload-protocol": "resumable",
            "x-goog-upload-command": "start",
            "x-goog-upload-header-content-length": "10",
            "x-goog-upload-header-content-type": "jsonl",
        },
    )
    assert start.status_code == 200 and start.headers["x-goog-upload-status"] == "active"
    session = start.headers["x-goog-upload-url"]
    assert session.startswith(url + "/upload/v1/files?upload_id=")
    wrong = httpx2.post(
        session, content=b"01234", headers={"x-goog-upload-command": "upload", "x-goog-upload-offset": "3"}
    )
    assert wrong.status_code == 400 and wrong.json()["error"]["status"] == "INVALID_ARGUMENT"
    part = httpx2.post(
        session, content=b"01234", headers={"x-goog-upload-command": "upload", "x-goog-upload-offset": "0"}
    )
    assert part.status_code == 200 and part.headers["x-goog-upload-status"] == "active"
    short = httpx2.post(
        session, content=b"56", headers={"x-goog-upload-command": "upload, finalize", "x-goog-upload-offset": "5"}
    )
    assert short.status_code == 400 and short.headers["x-goog-upload-status"] == "final"
    assert httpx2.post(f"{url}/upload/v1/files", headers={"x-goog-upload-command": "start"}).status_code == 403


@pytest.mark.parametrize("scenario", ["expire", "slow"])
def test_expiry_returns_no_results_at_all(admin, sandbox_proc, scenario):
    c = client(sandbox_proc[1])
    if scenario == "expire":
        admin.set_scenario("expire", complete_share=0.5)
        job = run(c, jsonl(["a", "b", "c", "d"]))
    else:  # still running when the 48 h window closes
        admin.set_scenario("slow", in_progress_s=3 * 24 * 3600)
        job = c.batches.create(model="gemini-2.5-flash", src=upload(c, jsonl(["a", "b"])).name)
        admin.clock(advance_s=48 * 3600 + 1)
        job = c.batches.get(name=job.name)
    assert job.state == types.JobState.JOB_STATE_EXPIRED and job.done
    assert job.dest is None  # no responses file
    assert admin.ledger() == []


def test_cancel_keeps_what_was_answered_and_a_bad_input_fails_the_batch(admin, sandbox_proc):
    c = client(sandbox_proc[1])
    admin.set_scenario("slow", in_progress_s=3600)
    job = c.batches.create(model="gemini-2.5-flash", src=upload(c, jsonl(["a", "b", "c", "d"])).name)
    admin.clock(advance_s=1800.05)  # half of the requests answered
    c.batches.cancel(name=job.name)
    for _ in range(100):
        job = c.batches.get(name=job.name)
        if job.done:
            break
        time.sleep(0.02)
    assert job.state == types.JobState.JOB_STATE_CANCELLED
    assert len(result_lines(c, job)) == 2 and len(admin.ledger()) == 2
    with pytest.raises(errors.ClientError) as ended:
        c.batches.cancel(name=job.name)
    assert ended.value.code == 400
    admin.set_scenario("normal")
    job = run(c, b'{"key": "a", "request": {"contents": []}}\n')
    assert job.state == types.JobState.JOB_STATE_FAILED and job.dest is None
    raw = httpx2.get(f"{sandbox_proc[1]}/v1/{job.name}", headers={"x-goog-api-key": "k"}).json()
    assert raw["error"]["code"] == 3 and "contents" in raw["error"]["message"]
    types.JobError.model_validate(raw["error"])


def test_a_long_system_instruction_is_cached_from_its_second_use(admin, sandbox_proc):
    c = client(sandbox_proc[1])
    job = run(c, jsonl(["a bug", "a billing issue", "hello"], system=LONG_SYSTEM))
    usage = {
        line["key"]: types.GenerateContentResponse.model_validate(line["response"]).usage_metadata
        for line in result_lines(c, job)
    }
    cached = sorted(u.cached_content_token_count or 0 for u in usage.values())
    assert cached[0] == 0 and cached[1] == cached[2] > 1024  # the first request wrote the implicit cache
    assert all(u.prompt_token_count > (u.cached_content_token_count or 0) for u in usage.values())


def test_type_urls_and_sha256_hashes_are_the_live_apis(admin, sandbox_proc):
    """``@type`` is the live API's ``v1main`` package on /v1 and /v1beta alike (the strings captured responses of
    real batches carry), and ``sha256Hash`` is what the Files API writes: base64 of the hex SHA-256 digest."""
    url = sandbox_proc[1]
    for version in ("v1", "v1beta"):
        c = client(url, api_version=version)
        data = jsonl(["a bug", "a billing issue"])
        f = upload(c, data)
        digest = base64.b64encode(hashlib.sha256(data).hexdigest().encode()).decode()
        assert f.sha256_hash == digest and len(f.sha256_hash) == 88
        assert c.files.get(name=f.name).sha256_hash == digest
        job = c.batches.create(model="gemini-2.5-flash", src=f.name)
        created = httpx2.get(f"{url}/{version}/{job.name}", headers={"x-goog-api-key": "k"}).json()
        assert (
            created["metadata"]["@type"]
            == "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch"
        )
        assert created["metadata"]["inputConfig"] == {"fileName": f.name}
        job = run(c, data)
        ended = httpx2.get(f"{url}/{version}/{job.name}", headers={"x-goog-api-key": "k"}).json()
        assert (
            ended["metadata"]["@type"] == "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch"
        )
        assert ended["response"] == {
            "@type": "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatchOutput",
            "responsesFile": job.dest.file_name,
        }
        assert job.dest.file_name == "files/batch-" + job.name.removeprefix(
            "batches/"
        )  # named as the live API names it
        out = c.files.get(name=job.dest.file_name)
        output = c.files.download(file=job.dest.file_name)
        assert out.sha256_hash == base64.b64encode(hashlib.sha256(output).hexdigest().encode()).decode()
