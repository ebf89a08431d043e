"""``discard`` on the Anthropic batch executor, real anthropic SDK against the sandbox: an ended batch is deleted
(gone from ``batches.list``, its results no longer served); a second discard finds it gone and still succeeds; a
batch still processing cannot be deleted (the error is translated, nothing is lost)."""

import anthropic
import pyarrow as pa
import pytest

from batch_pipeline.core.errors import SystemicError
from batch_pipeline.core.ledger.executor import DiscardableBatch, RequestPlan, ShardWork
from batch_pipeline.core.spec.job import BackendSpec
from batch_pipeline.core.spec.loading import parse_spec
from batch_pipeline.core.spec.quota import Retention
from batch_pipeline.executors.anthropic.batch import AnthropicBatchExecutor
from batch_pipeline.executors.registry import create_executor

from ..conftest import wait_ended

SPEC = """
name: ad
input: {path: in.jsonl, text_field: body}
prompt: {version: v1, system: "Label it.", template: "{body}"}
model: claude-sonnet-4-5
backend: {name: anthropic_batch, settings: {sandbox: true}}
sampling: {max_tokens: 16}
output: {choice: [billing, bug, other]}
"""


def work(n: int = 8) -> ShardWork:
    items = pa.table(
        {
            "request_id": [f"{i:064x}" for i in range(n)],
            "user_prompt": [f"ticket {i}: a billing question" for i in range(n)],
        }
    )
    return ShardWork("ad", "s00001", 1, "ad:s00001:1", RequestPlan.from_spec(parse_spec(SPEC)), items)


def executor(**settings) -> AnthropicBatchExecutor:
    ex = create_executor(BackendSpec(name="anthropic_batch", settings={"sandbox": True, **settings}))
    assert isinstance(ex, AnthropicBatchExecutor) and isinstance(ex, DiscardableBatch)
    return ex


def batch_ids(ex: AnthropicBatchExecutor) -> set[str]:
    return {b.id for b in ex.client.messages.batches.list(limit=100)}


def test_discard_deletes_the_ended_batch_and_its_results_and_is_idempotent(admin):
    ex = executor()
    assert ex.retention == Retention.DELETE and executor(retention="keep").retention == Retention.KEEP
    handle = ex.submit(work())
    wait_ended(ex, handle)
    assert handle.batch_id in batch_ids(ex) and len(list(ex.fetch(handle))) > 0
    assert ex.discard(handle) == [handle.batch_id]
    assert handle.batch_id not in batch_ids(ex)
    with pytest.raises(anthropic.NotFoundError):
        ex.client.messages.batches.results(handle.batch_id)
    assert ex.discard(handle) == [handle.batch_id]  # already gone: not-found counts as deleted


def test_a_batch_still_processing_is_not_deleted(admin):
    ex = executor()
    admin.clock(freeze=True)  # the batch stays in progress
    handle = ex.submit(work())
    with pytest.raises(SystemicError, match="batch delete"):
        ex.discard(handle)
    assert handle.batch_id in batch_ids(ex)
