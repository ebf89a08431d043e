"""The sandbox's Azure OpenAI shape through the real ``openai.AzureOpenAI``: objects held to the OpenAPI schemas,
Azure's relative batch endpoint, a line with OpenAI's path refused, expiry and cancel as on ``/v1``."""

import json

import openai
import pytest

from ..support import read_jsonl, to_jsonl, validate_spec


@pytest.fixture
def azure(sandbox_url, admin):
    sdk = openai.AzureOpenAI(
        azure_endpoint=sandbox_url, api_key="sk-sandbox", api_version="2024-10-21", max_retries=0, timeout=20
    )
    yield sdk
    sdk.close()


def line(custom_id: str, text: str, url: str = "/chat/completions") -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": url,
        "body": {"model": "my-deployment", "messages": [{"role": "user", "content": text}], "max_tokens": 8},
    }


def create(azure: openai.AzureOpenAI, lines: list[dict], **kwargs) -> dict:
    raw = azure.files.with_raw_response.create(file=("in.jsonl", to_jsonl(lines)), purpose="batch")
    validate_spec("OpenAIFile", json.loads(raw.text))
    created = azure.batches.with_raw_response.create(
        input_file_id=raw.parse().id, endpoint="/chat/completions", completion_window="24h", **kwargs
    )
    batch = json.loads(created.text)
    validate_spec("Batch", batch)
    return batch


def wait(azure: openai.AzureOpenAI, batch_id: str) -> dict:
    for _ in range(400):
        batch = json.loads(azure.batches.with_raw_response.retrieve(batch_id).text)
        validate_spec("Batch", batch)
        if batch["status"] in ("completed", "failed", "expired", "cancelled"):
            return batch
    raise AssertionError("batch never ended")


def test_a_batch_runs_and_its_files_are_shaped_as_on_v1(azure, admin):
    batch = wait(azure, create(azure, [line(f"r{i}", f"ticket {i}") for i in range(5)])["id"])
    assert batch["status"] == "completed" and batch["endpoint"] == "/chat/completions"
    out = read_jsonl(azure, batch["output_file_id"])
    assert sorted(x["custom_id"] for x in out) == [f"r{i}" for i in range(5)]
    assert all(x["response"]["status_code"] == 200 and x["response"]["body"]["usage"]["prompt_tokens"] > 0 for x in out)
    assert [e["provider"] for e in admin.ledger()] == ["azure_openai"] * 5


def test_openais_endpoint_and_line_url_are_refused_on_azure(azure, admin):
    raw = azure.files.create(file=("in.jsonl", to_jsonl([line("a", "x", url="/v1/chat/completions")])), purpose="batch")
    with pytest.raises(openai.BadRequestError, match="/chat/completions"):
        azure.batches.create(input_file_id=raw.id, endpoint="/v1/chat/completions", completion_window="24h")
    batch = wait(azure, create(azure, [line("a", "x", url="/v1/chat/completions")])["id"])
    assert batch["status"] == "failed" and batch["errors"]["data"][0]["code"] == "invalid_url"


def test_expiry_and_cancel_behave_as_on_v1(azure, admin):
    expired = wait(
        azure, create(azure, [line(f"e{i}", "x") for i in range(3)], metadata={"sandbox_scenario": "expire"})["id"]
    )
    assert expired["status"] == "expired"
    assert {x["error"]["code"] for x in read_jsonl(azure, expired["error_file_id"])} == {"batch_expired"}
    answered = {x["custom_id"] for x in read_jsonl(azure, expired["output_file_id"])}
    admin.clock(freeze=True)
    batch = create(azure, [line("c", "x")])
    cancelled = azure.batches.cancel(batch["id"])
    assert cancelled.status in ("cancelling", "cancelled")
    admin.clock(freeze=False)
    assert wait(azure, batch["id"])["status"] == "cancelled"
    assert {e["custom_id"] for e in admin.ledger()} == answered  # what ran before expiry; nothing cancelled
