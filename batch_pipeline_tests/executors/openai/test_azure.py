"""The Azure OpenAI batch executor through the real ``openai.AzureOpenAI`` over HTTP against the sandbox."""

import json

import httpx2
import openai
import pyarrow as pa
import pytest

from batch_pipeline.core.errors import ConfigError, SystemicError
from batch_pipeline.core.ledger.executor import BatchState, RequestPlan, ShardWork
from batch_pipeline.core.spec.job import BackendSpec
from batch_pipeline.core.spec.loading import parse_spec
from batch_pipeline.executors.endpoint import SANDBOX_URL_ENV
from batch_pipeline.executors.openai.azure import AZURE_CHAT_URL, AzureOpenAIBatchExecutor, AzureOpenAIBatchSettings
from batch_pipeline.executors.registry import create_executor, names

from ..conftest import wait_ended

LABELS = ["billing", "bug", "other"]
DEPLOYMENT = "labels-4o-mini-global-batch"
SPEC = f"""
name: az
input: {{path: in.jsonl, text_field: body}}
prompt: {{version: v1, system: "Label it.", template: "{{body}}"}}
model: gpt-4o-mini
backend: {{name: azure_openai_batch, settings: {{sandbox: true, deployments: {{gpt-4o-mini: {DEPLOYMENT}}}}}}}
sampling: {{max_tokens: 16}}
output: {{choice: {LABELS}}}
"""


@pytest.fixture(autouse=True)
def _no_azure_credentials(monkeypatch):
    for name in ("AZURE_OPENAI_API_KEY", "AZURE_OPENAI_AD_TOKEN", "AZURE_OPENAI_ENDPOINT", "OPENAI_API_VERSION"):
        monkeypatch.delenv(name, raising=False)


def work(n: int = 12, attempt: int = 1) -> ShardWork:
    spec = parse_spec(SPEC)
    items = pa.table(
        {
            "request_id": [f"{i:064x}" for i in range(n)],
            "user_prompt": [f"ticket {i}: my invoice was wrong" for i in range(n)],
        }
    )
    return ShardWork("az", "s00001", attempt, f"az:s00001:{attempt}", RequestPlan.from_spec(spec), items)


def executor(**settings) -> AzureOpenAIBatchExecutor:
    backend = parse_spec(SPEC).backend
    return create_executor(BackendSpec(name=backend.name, settings={**backend.settings, **settings}))


def azure_paths(admin) -> list[tuple[str, str, int]]:
    return [(r["method"], r["path"], r["status"]) for r in admin.requests() if r["path"].startswith("/openai/")]


def test_registry_knows_azure_and_its_settings_are_strict():
    assert "azure_openai_batch" in names()
    with pytest.raises(ConfigError, match="api_verison"):
        executor(api_verison="2024-10-21")


def test_lines_carry_the_deployment_and_azures_relative_url(admin):
    lines = [json.loads(x) for x in executor()._request_lines(work(3)).decode().splitlines()]
    assert {line["url"] for line in lines} == {AZURE_CHAT_URL}
    assert {line["body"]["model"] for line in lines} == {DEPLOYMENT}
    unmapped = executor(deployments={})._request_lines(work(1))
    assert json.loads(unmapped)["body"]["model"] == "gpt-4o-mini"  # no mapping: the model's own name


def test_submit_poll_fetch_through_the_openai_prefix_with_api_version_and_api_key(admin):
    ex, w = executor(), work()
    handle = ex.submit(w)
    status = wait_ended(ex, handle)
    assert status.state == BatchState.COMPLETED and status.total == 12
    got = pa.concat_tables(list(ex.fetch(handle)))
    assert sorted(got.column("request_id").to_pylist()) == sorted(w.request_ids)
    assert all(json.loads(t)["label"] in LABELS for t in got.column("output_text").to_pylist())
    paths = azure_paths(admin)
    assert ("POST", "/openai/files", 200) in paths and ("POST", "/openai/batches", 200) in paths
    assert not [r for r in admin.requests() if r["path"].startswith("/v1/")]  # nothing on OpenAI's paths
    ledger = admin.ledger()
    assert {e["provider"] for e in ledger} == {"azure_openai"} and {e["model"] for e in ledger} == {DEPLOYMENT}
    assert len(ledger) == 12


def test_find_reattaches_by_key(admin):
    ex = executor()
    handle = ex.submit(work(attempt=2))
    ex.submit(work(attempt=3))
    found = ex.find("az:s00001:2")
    assert found is not None and found.batch_id == handle.batch_id
    assert ex.find("az:s00001:9") is None


def test_an_entra_token_from_the_environment_is_sent_as_a_bearer_token(admin, monkeypatch):
    monkeypatch.setenv("AZURE_OPENAI_AD_TOKEN", "entra-token-abc")
    ex = executor()
    assert ex.secret == "entra-token-abc" and ex.client.api_key != "entra-token-abc"
    handle = ex.submit(work(2))
    assert wait_ended(ex, handle).state == BatchState.COMPLETED


@pytest.mark.parametrize("variable", ["AZURE_OPENAI_API_KEY", "AZURE_OPENAI_AD_TOKEN"])
def test_a_bad_key_or_token_is_systemic_and_redacted(admin, monkeypatch, variable):
    monkeypatch.setenv(variable, "sk-sandbox-bad")
    with pytest.raises(SystemicError, match="401") as err:
        executor().submit(work())
    assert "sk-sandbox-bad" not in str(err.value) and "Azure OpenAI" in str(err.value)
    assert admin.ledger() == []


def test_the_sandbox_refuses_a_call_without_api_version_or_credentials(admin, sandbox_proc):
    url = sandbox_proc[1]
    bare = openai.OpenAI(base_url=url + "/openai", api_key="k", max_retries=0)  # no api-version
    with pytest.raises(openai.NotFoundError):
        bare.batches.list()
    old = openai.AzureOpenAI(azure_endpoint=url, api_key="k", api_version="2023-05-15", max_retries=0)
    with pytest.raises(openai.NotFoundError):  # before Files + Batches existed
        old.batches.list()
    anonymous = httpx2.get(url + "/openai/batches", params={"api-version": "2024-10-21"})
    assert anonymous.status_code == 401 and anonymous.json()["error"]["code"] == "401"
    good = httpx2.get(url + "/openai/batches", params={"api-version": "2025-04-01-preview"}, headers={"api-key": "k"})
    assert good.status_code == 200 and good.json()["object"] == "list"


def test_a_rate_limited_create_waits_as_told(admin):
    admin.set_scenario("rate_limit", times=1, retry_after_ms=200, on=["create_batch"])
    ex = executor()
    handle = ex.submit(work(3))
    creates = [r for r in admin.requests() if r["method"] == "POST" and r["path"] == "/openai/batches"]
    assert [r["status"] for r in creates] == [429, 200]
    assert creates[1]["monotonic"] - creates[0]["monotonic"] >= 0.2
    assert wait_ended(ex, handle).state == BatchState.COMPLETED


def test_an_unknown_deployment_is_systemic(admin):
    ex = executor(deployments={"gpt-4o-mini": "unknown-deployment"})
    with pytest.raises(SystemicError, match="404"):
        ex.submit(work(2))


def test_no_endpoint_and_no_credentials_are_clear_config_errors(monkeypatch):
    with pytest.raises(ConfigError, match="AZURE_OPENAI_ENDPOINT"):
        AzureOpenAIBatchExecutor(AzureOpenAIBatchSettings())
    monkeypatch.setenv("AZURE_OPENAI_ENDPOINT", "https://example-resource.openai.azure.com")
    with pytest.raises(ConfigError, match="AZURE_OPENAI_API_KEY"):
        AzureOpenAIBatchExecutor(AzureOpenAIBatchSettings())
    monkeypatch.delenv(SANDBOX_URL_ENV, raising=False)
    with pytest.raises(ConfigError, match=SANDBOX_URL_ENV):
        AzureOpenAIBatchExecutor(AzureOpenAIBatchSettings(sandbox=True))
