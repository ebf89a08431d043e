"""The quote's prompt sample (``estimate.sample_shards``): the lowest request IDs of each shard it draws from, with
their prompts. It reads a shard's prompts only up to the last row it picks, which is the file's head when the file
is in request-ID order (as the manifest writes it); a file in any other order gives the same sample."""

import polars as pl
import pyarrow.parquet as pq
import pytest

from batch_pipeline.core.manifest.shards import Manifest, build_manifest
from batch_pipeline.core.money.estimate import sample_shards
from batch_pipeline.core.spec.loading import parse_spec
from batch_pipeline.core.store import Store

SPEC = """
name: sample
input: {{path: {path}, text_field: body}}
prompt: {{version: v1, template: "{{body}}"}}
model: gpt-4o-mini
backend: {{name: openai_batch, settings: {{sandbox: true}}}}
sampling: {{max_tokens: 16}}
output: {{choice: [billing, bug]}}
shards: {{max_requests: 40}}
"""


def _manifest(tmp_path) -> Manifest:
    path = tmp_path / "in.jsonl"
    path.write_text("".join(f'{{"body": "ticket {i} about {"billing" * (i % 7)}"}}\n' for i in range(200)))
    spec = parse_spec(SPEC.format(path=path))
    store = Store(tmp_path / "home")
    build_manifest(spec, store)
    return Manifest(spec.name, store)


def _expected(manifest: Manifest, shards: list[str], ids: pl.DataFrame | None, how: str, n: int) -> pl.DataFrame:
    """The definition, from whole shard files: each shard's rows that ``ids`` keeps or leaves, the n lowest IDs."""
    parts = []
    for shard in shards:
        frame = pl.from_arrow(manifest.shard_items(shard, ["request_id", "user_prompt", "est_input_tokens"]))
        assert isinstance(frame, pl.DataFrame)
        if ids is not None:
            frame = frame.join(ids, on="request_id", how=how)  # type: ignore[arg-type]
        parts.append(frame.sort("request_id").head(n))
    return pl.concat(parts).with_columns(pl.col("est_input_tokens").cast(pl.Int64))


@pytest.mark.parametrize("how", ["semi", "anti", None])
@pytest.mark.parametrize("order", ["as written", "reversed"])
def test_the_sample_is_the_lowest_request_ids_of_each_shard_whatever_the_files_order(tmp_path, how, order):
    manifest = _manifest(tmp_path)
    shards = sorted(manifest.shard_ids())
    assert len(shards) == 5
    if order == "reversed":  # a file in another order than the manifest writes (by hand): read further, same rows
        for shard in shards:
            path = manifest.store.local_path(manifest.paths.shard_items(shard))
            assert path is not None
            table = pq.read_table(path)
            pq.write_table(table.take(list(range(table.num_rows - 1, -1, -1))), path)
    every = pl.from_arrow(manifest.item_index(["request_id"]))
    assert isinstance(every, pl.DataFrame)
    ids = None if how is None else every.sample(fraction=0.5, seed=7)
    sample = sample_shards(manifest, shards, ids, how or "semi", limit=30, shards=3)
    expected = _expected(manifest, [shards[0], shards[1], shards[3]], ids, how or "semi", 10)
    assert sample.height == 30
    assert sample.equals(expected)
