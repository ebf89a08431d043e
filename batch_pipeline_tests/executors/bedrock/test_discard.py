"""``discard`` on bedrock_batch, real boto3 against the sandbox and its S3: the input object we uploaded and the
job's output folder (``<output>/<job id>/``: the ``.jsonl.out`` and ``manifest.json.out``) are deleted, another
attempt's objects stay; a second discard deletes nothing new and still succeeds."""

import pyarrow as pa

from batch_pipeline.core.ledger.executor import DiscardableBatch, RequestPlan, ShardWork
from batch_pipeline.core.spec.job import BackendSpec
from batch_pipeline.core.spec.loading import parse_spec
from batch_pipeline.core.spec.quota import Retention
from batch_pipeline.executors.bedrock.batch import BedrockBatchExecutor, _output_folder
from batch_pipeline.executors.registry import create_executor

from ..conftest import wait_ended

SPEC = """
name: bd
input: {path: in.jsonl, text_field: body}
prompt: {version: v1, system: "Label the support ticket.", template: "{body}"}
model: anthropic.claude-3-5-haiku-20241022-v1:0
backend: {name: bedrock_batch, settings: {sandbox: true}}
sampling: {max_tokens: 16}
output: {choice: [billing, bug, other]}
"""


def work(shard: str, n: int = 100) -> ShardWork:
    items = pa.table(
        {
            "request_id": [f"{shard}{i:058x}" for i in range(n)],
            "user_prompt": [f"ticket {i}: a billing question" for i in range(n)],
        }
    )
    return ShardWork("bd", shard, 1, f"bd:{shard}:1", RequestPlan.from_spec(parse_spec(SPEC)), items)


def executor(**settings) -> BedrockBatchExecutor:
    ex = create_executor(BackendSpec(name="bedrock_batch", settings={"sandbox": True, **settings}))
    assert isinstance(ex, BedrockBatchExecutor) and isinstance(ex, DiscardableBatch)
    return ex


def keys(ex: BedrockBatchExecutor, handle) -> set[str]:
    """The attempt's input object and everything in its job's output folder, as s3:// URIs."""
    bucket, prefix = _output_folder(ex._job(handle), handle.batch_id)
    listing = ex.s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents") or []
    found = {f"s3://{bucket}/{o['Key']}" for o in listing}
    in_bucket, _, key = handle.input_file_id[len("s3://") :].partition("/")
    if ex.s3.list_objects_v2(Bucket=in_bucket, Prefix=key).get("KeyCount"):
        found.add(handle.input_file_id)
    return found


def test_discard_deletes_our_input_and_output_objects_and_is_idempotent(admin):
    ex = executor()
    assert ex.retention == Retention.DELETE and executor(retention="keep").retention == Retention.KEEP
    other, handle = ex.submit(work("s00001")), ex.submit(work("s00002"))
    wait_ended(ex, handle)
    wait_ended(ex, other)
    ours, theirs = keys(ex, handle), keys(ex, other)
    assert handle.input_file_id in ours and any(k.endswith(".jsonl.out") for k in ours)
    assert any(k.endswith("manifest.json.out") for k in ours)
    assert set(ex.discard(handle)) == ours
    assert keys(ex, handle) == set() and keys(ex, other) == theirs
    assert ex.discard(handle) == [handle.input_file_id]  # nothing left under the output folder
    assert keys(ex, handle) == set()
