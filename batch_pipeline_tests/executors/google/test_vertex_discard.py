"""``discard`` on vertex_batch, real google-genai SDK and google-cloud-storage against the sandbox and a loopback
GCS emulator: the input object we uploaded and the predictions under the job's output prefix are deleted, another
attempt's objects stay; a second discard finds them gone and still succeeds."""

import hashlib

import pyarrow as pa

from batch_pipeline.core.ledger.executor import DiscardableBatch, RequestPlan, ShardWork
from batch_pipeline.core.spec.job import BackendSpec, OutputSpec, SamplingSpec
from batch_pipeline.core.spec.quota import Retention
from batch_pipeline.executors.google.gcs import parse_gs_uri
from batch_pipeline.executors.google.vertex_batch import VertexBatchExecutor
from batch_pipeline.executors.registry import create_executor

from ..conftest import wait_ended

PLAN = RequestPlan(
    model="gemini-2.5-flash",
    system="Label the ticket.",
    sampling=SamplingSpec(temperature=0, max_tokens=16),
    output=OutputSpec(choice=["a", "b"]),
)


def work(key: str, n: int = 4) -> ShardWork:
    ids = [hashlib.sha256(f"{key}-{i}".encode()).hexdigest() for i in range(n)]
    job, shard, attempt = key.split(":")
    return ShardWork(
        job,
        shard,
        int(attempt),
        key,
        PLAN,
        pa.table({"request_id": ids, "user_prompt": [f"ticket {i}" for i in range(n)]}),
    )


def executor(**settings) -> VertexBatchExecutor:
    ex = create_executor(BackendSpec(name="vertex_batch", settings={"sandbox": True, **settings}))
    assert isinstance(ex, VertexBatchExecutor) and isinstance(ex, DiscardableBatch)
    return ex


def objects(ex: VertexBatchExecutor, uri: str) -> set[str]:
    """Every object under the attempt's own directory (its input's folder)."""
    bucket, name = parse_gs_uri(uri)
    folder = name.rsplit("/", 1)[0] + "/"
    return {f"gs://{bucket}/{b.name}" for b in ex.gcs.client.list_blobs(bucket, prefix=folder)}


def test_discard_deletes_our_input_and_prediction_objects_and_is_idempotent(vertex_sandbox):
    ex = executor()
    assert ex.retention == Retention.DELETE and executor(retention="keep").retention == Retention.KEEP
    other = ex.submit(work("vd:s00001:1"))
    handle = ex.submit(work("vd:s00002:1"))
    wait_ended(ex, handle)
    wait_ended(ex, other)
    ours, theirs = objects(ex, handle.input_file_id), objects(ex, other.input_file_id)
    predictions = {o for o in ours if o.endswith(".jsonl") and "/output/" in o}
    assert handle.input_file_id in ours and predictions, ours
    deleted = ex.discard(handle)
    assert set(deleted) == ours and objects(ex, handle.input_file_id) == set()
    assert objects(ex, other.input_file_id) == theirs  # another attempt's objects stay
    assert ex.discard(handle) == [handle.input_file_id]  # already gone: nothing under the prefix, input not found
