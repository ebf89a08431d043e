"""``discard`` on the OpenAI and Azure batch executors, real openai SDK against the sandbox: once a batch has ended,
its input, output and error files are deleted (``files.list`` no longer shows them); a second discard finds them
gone and still succeeds; a server that keeps failing the delete is a TransientError (the runner leaves it for the
sweep)."""

import pyarrow as pa
import pytest

from batch_pipeline.core.errors import TransientError
from batch_pipeline.core.ledger.executor import BatchExecutor, DiscardableBatch, RequestPlan, ShardWork
from batch_pipeline.core.spec.job import BackendSpec
from batch_pipeline.core.spec.loading import parse_spec
from batch_pipeline.core.spec.quota import Retention
from batch_pipeline.executors.registry import create_executor

from ..conftest import wait_ended

SPEC = """
name: dx
input: {path: in.jsonl, text_field: body}
prompt: {version: v1, system: "Label it.", template: "{body}"}
model: gpt-4o-mini
backend: {name: openai_batch, settings: {sandbox: true}}
sampling: {max_tokens: 16}
output: {choice: [billing, bug, other]}
"""
AZURE = {"sandbox": True, "deployments": {"gpt-4o-mini": "labels-4o-mini-global-batch"}}


@pytest.fixture(autouse=True)
def _no_azure_credentials(monkeypatch):
    for name in ("AZURE_OPENAI_API_KEY", "AZURE_OPENAI_AD_TOKEN", "AZURE_OPENAI_ENDPOINT", "OPENAI_API_VERSION"):
        monkeypatch.delenv(name, raising=False)


def work(n: int = 12) -> ShardWork:
    items = pa.table(
        {
            "request_id": [f"{i:064x}" for i in range(n)],
            "user_prompt": [f"ticket {i}: my invoice was wrong" for i in range(n)],
        }
    )
    return ShardWork("dx", "s00001", 1, "dx:s00001:1", RequestPlan.from_spec(parse_spec(SPEC)), items)


def executor(name: str, **settings):
    base = AZURE if name == "azure_openai_batch" else {"sandbox": True}
    ex = create_executor(BackendSpec(name=name, settings={**base, **settings}))
    assert isinstance(ex, BatchExecutor) and isinstance(ex, DiscardableBatch)
    return ex


def file_ids(ex) -> set[str]:
    return {f.id for f in ex.client.files.list()}


@pytest.mark.parametrize("name", ["openai_batch", "azure_openai_batch"])
def test_discard_deletes_the_input_output_and_error_files_and_is_idempotent(admin, name):
    ex = executor(name)
    assert ex.retention == Retention.DELETE  # the default
    admin.set_scenario("line_errors", rate=0.3, times=5)  # some lines fail: the batch has an error file too
    handle = ex.submit(work())
    wait_ended(ex, handle)
    batch = ex.client.batches.retrieve(handle.batch_id)
    ours = {batch.input_file_id, batch.output_file_id, batch.error_file_id}
    assert None not in ours and ours <= file_ids(ex)
    deleted = ex.discard(handle)
    assert set(deleted) == ours and len(deleted) == 3
    assert not ours & file_ids(ex)
    assert set(ex.discard(handle)) == ours  # already gone: not-found counts as deleted
    deletes = [r for r in admin.requests() if r["method"] == "DELETE"]
    assert sorted(r["status"] for r in deletes) == [200] * 3 + [404] * 3


def test_retention_keep_is_the_settings_value(admin):
    assert executor("openai_batch", retention="keep").retention == Retention.KEEP


def test_a_delete_the_server_keeps_failing_is_transient(admin):
    ex = executor("openai_batch", max_retries=0)
    handle = ex.submit(work())
    wait_ended(ex, handle)
    admin.set_scenario("server_error", times=10, on=["delete_file"])
    with pytest.raises(TransientError, match="file delete"):
        ex.discard(handle)
    assert handle.input_file_id in file_ids(ex)
