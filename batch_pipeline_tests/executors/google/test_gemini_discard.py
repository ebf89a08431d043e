"""``discard`` on the gemini_batch executor, real google-genai SDK against the sandbox: the uploaded input file, the
result file and then the ended batch are deleted (gone from ``files.list`` and ``batches.list``); a second discard
finds them gone and still succeeds; a handle re-attached by ``find`` (no input file recorded) still gets its input
deleted, read from the batch."""

import pyarrow as pa
import pytest

from batch_pipeline.core.ledger.executor import BatchHandle, DiscardableBatch, RequestPlan, ShardWork
from batch_pipeline.core.spec.job import BackendSpec
from batch_pipeline.core.spec.loading import parse_spec
from batch_pipeline.core.spec.quota import Retention
from batch_pipeline.executors.google.gemini_batch import GeminiBatchExecutor
from batch_pipeline.executors.registry import create_executor

from ..conftest import wait_ended

SPEC = """
name: gd
input: {path: in.jsonl, text_field: body}
prompt: {version: v1, system: "Label it.", template: "{body}"}
model: gemini-2.5-flash
backend: {name: gemini_batch, settings: {sandbox: true}}
sampling: {max_tokens: 16}
output: {choice: [billing, bug, other]}
"""


@pytest.fixture(autouse=True)
def _no_google_keys(monkeypatch):
    for name in ("GEMINI_API_KEY", "GOOGLE_API_KEY", "GOOGLE_GENAI_API_VERSION", "GOOGLE_GEMINI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


def work(attempt: int = 1, n: int = 8) -> ShardWork:
    items = pa.table(
        {
            "request_id": [f"{attempt:02x}{i:062x}" for i in range(n)],
            "user_prompt": [f"ticket {i}: a bug on start" for i in range(n)],
        }
    )
    return ShardWork("gd", "s00001", attempt, f"gd:s00001:{attempt}", RequestPlan.from_spec(parse_spec(SPEC)), items)


def executor(**settings) -> GeminiBatchExecutor:
    ex = create_executor(BackendSpec(name="gemini_batch", settings={"sandbox": True, **settings}))
    assert isinstance(ex, GeminiBatchExecutor) and isinstance(ex, DiscardableBatch)
    return ex


def file_names(ex: GeminiBatchExecutor) -> set[str]:
    return {str(f.name) for f in ex.client.files.list(config={"page_size": 100})}


def batch_names(ex: GeminiBatchExecutor) -> set[str]:
    return {str(b.name) for b in ex.client.batches.list(config={"page_size": 100})}


def test_discard_deletes_the_input_and_result_files_then_the_batch_and_is_idempotent(admin):
    ex = executor()
    assert ex.retention == Retention.DELETE and executor(retention="keep").retention == Retention.KEEP
    handle = ex.submit(work())
    wait_ended(ex, handle)
    job = ex.client.batches.get(name=handle.batch_id)
    result = job.dest.file_name if job.dest is not None else None
    assert result and {handle.input_file_id, result} <= file_names(ex) and handle.batch_id in batch_names(ex)
    assert ex.discard(handle) == [handle.input_file_id, result, handle.batch_id]
    assert file_names(ex) == set() and batch_names(ex) == set()
    assert ex.discard(handle) == [handle.input_file_id, handle.batch_id]  # gone: the result file is not known now


def test_a_reattached_handle_without_an_input_file_gets_it_from_the_batch(admin):
    ex = executor()
    kept = ex.submit(work(1))  # another attempt's files must stay
    handle = ex.submit(work(2))
    wait_ended(ex, handle)
    wait_ended(ex, kept)
    found = ex.find(handle.key)
    assert found is not None and found.input_file_id is None
    ex.discard(BatchHandle(found.backend, found.batch_id, found.key))
    assert handle.input_file_id not in file_names(ex) and handle.batch_id not in batch_names(ex)
    assert kept.input_file_id in file_names(ex) and kept.batch_id in batch_names(ex)
