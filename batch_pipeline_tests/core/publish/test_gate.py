"""The blocking gate read a chunk at a time: each fault is found wherever it sits (first chunk, last chunk, a
duplicate line split across two chunks), with the same verdict as the whole-table pandera schema."""

import pandera.pandas as pandera
import polars as pl
import pytest

from batch_pipeline.core.publish.gate import KEPT_CASES, check_staged, staged_row_schema
from batch_pipeline.core.spec.loading import parse_spec
from batch_pipeline.core.store import Store

SPEC = parse_spec("""
name: gate
input: {path: in.jsonl, text_field: body}
prompt: {version: v1, system: "Label it.", template: "{body}"}
model: gpt-4o-mini
backend: {name: openai_batch, settings: {sandbox: true}}
sampling: {max_tokens: 16}
output: {choice: [billing, bug, other]}
""")
ROWS, CHUNK = 300, 100


def staged(n: int = ROWS) -> pl.DataFrame:
    labels = ["billing", "bug", "other"]
    return pl.DataFrame(
        {
            "source": [f"in-{i % 3}.jsonl" for i in range(n)],
            "line": [i + 1 for i in range(n)],
            "source_key": [None] * n,
            "request_id": [f"{i:064x}" for i in range(n)],
            "shard_id": [f"s{i // 75:05d}" for i in range(n)],
            "output": [labels[i % 3] for i in range(n)],
            "output_text": [labels[i % 3] for i in range(n)],
            "finish_reason": ["stop"] * n,
            "model": ["gpt-4o-mini"] * n,
            "prompt_version": ["v1"] * n,
            "attempt": pl.Series([1] * n, dtype=pl.Int32),
            "input_tokens": [12] * n,
            "output_tokens": [1] * n,
            "cost_usd": [0.00001] * n,
            "is_duplicate": [False] * n,
        }
    )


def gate(tmp_path, frame: pl.DataFrame):
    store = Store(tmp_path / "home")
    store.write_bytes("staged.parquet", _parquet(frame))
    return check_staged(SPEC, store, "staged.parquet", chunk_rows=CHUNK)


def _parquet(frame: pl.DataFrame) -> bytes:
    import io

    buf = io.BytesIO()
    frame.write_parquet(buf, row_group_size=37)  # row groups that do not line up with the chunks
    return buf.getvalue()


def whole_table_fails(frame: pl.DataFrame) -> bool:
    """The old gate: the pandera schema with one row per source line, over the whole table at once."""
    rules = staged_row_schema(SPEC)
    schema = pandera.DataFrameSchema(rules.columns, unique=["source", "line"], strict=False, coerce=False)
    try:
        schema.validate(frame.to_pandas(), lazy=True)
        return False
    except pandera.errors.SchemaErrors:
        return True


def set_at(frame: pl.DataFrame, row: int, **values) -> pl.DataFrame:
    index = pl.int_range(pl.len())
    return frame.with_columns(
        [pl.when(index == row).then(pl.lit(v)).otherwise(pl.col(c)).alias(c) for c, v in values.items()]
    )


def test_a_clean_table_passes_every_rule_in_chunks(tmp_path):
    report = gate(tmp_path, staged())
    assert (report.rows, report.chunks) == (ROWS, ROWS // CHUNK)
    assert report.schema_ok and report.contract_violations == 0 and report.truncated == 0
    assert report.failure_cases().height == 0 and not whole_table_fails(staged())


@pytest.mark.parametrize("row", [0, 157, ROWS - 1])
@pytest.mark.parametrize(
    ("fault", "values"),
    [("model", {"model": "some-other-model"}), ("version", {"prompt_version": "v0"}), ("id", {"request_id": "x"})],
)
def test_a_row_rule_broken_anywhere_fails_as_the_whole_table_does(tmp_path, row, fault, values):
    frame = set_at(staged(), row, **values)
    report = gate(tmp_path, frame)
    assert not report.schema_ok and report.schema_failures == 1
    assert whole_table_fails(frame)
    [case] = report.failure_cases().to_dicts()
    assert case["column"] == next(iter(values)) and case["failure_case"] == next(iter(values.values()))


def test_a_source_line_staged_twice_across_two_chunks_is_found(tmp_path):
    """Each chunk alone is clean (row-local rules pass), yet the file breaks one-row-per-line: DuckDB counts it."""
    frame = set_at(staged(), ROWS - 1, source="in-0.jsonl", line=1)  # row 0's line again, in the last chunk
    report = gate(tmp_path, frame)
    assert report.schema_failures == 0 and report.duplicate_lines == 1 and not report.schema_ok
    assert whole_table_fails(frame)
    [case] = report.failure_cases().to_dicts()
    assert case["check"] == "multiple_fields_uniqueness" and case["failure_case"] == "in-0.jsonl:1 (2 rows)"


def test_truncation_and_contract_violations_are_counted_in_every_chunk(tmp_path):
    truncated = staged()
    for row in (3, 150, 299):
        truncated = set_at(truncated, row, finish_reason="length")
    report = gate(tmp_path / "a", truncated)
    assert report.truncated == 3 and report.contract_violations == 3  # a truncated answer breaks the contract too
    off_contract = staged()
    for row in (10, 298):
        off_contract = set_at(off_contract, row, output_text="not_a_label")
    report = gate(tmp_path / "b", off_contract)
    assert report.truncated == 0 and report.contract_violations == 2


def test_the_kept_failure_cases_are_capped_but_the_count_is_whole(tmp_path):
    frame = staged().with_columns(pl.lit("v0").alias("prompt_version"))
    report = gate(tmp_path, frame)
    assert report.schema_failures == ROWS and report.failure_cases().height == KEPT_CASES


def test_a_column_the_rules_need_missing_from_the_file_fails_the_schema(tmp_path):
    """The gate reads only the columns its rules check: one the file lacks is pandera's to report, not a read
    error; columns no rule reads are left unread."""
    frame = staged().drop("prompt_version").with_columns(pl.lit("batch_1").alias("provider_batch_id"))
    report = gate(tmp_path, frame)
    assert not report.schema_ok and report.rows == ROWS
    assert "prompt_version" in report.failure_cases()["failure_case"].to_list()
