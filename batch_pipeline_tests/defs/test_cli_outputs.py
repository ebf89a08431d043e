"""`batch-pipeline export` in every format and `batch-pipeline report`, by job name and by spec path."""

import csv
import json

import polars as pl
import pytest

from batch_pipeline.cli import main
from batch_pipeline.cli_jobs import remember_spec
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline.defs.pipeline import run_job
from batch_pipeline.executors.openai.format import parse_output_block
from batch_pipeline_tests.sandbox.support import validate_spec

ROWS = [
    {
        "ticket_id": f"T{i}",
        "subject": f"case {i}",
        "body": "My card was charged twice." if i else "[[sandbox:poison]] Broken ticket.",
    }
    for i in range(12)
]


@pytest.fixture
def done(sandbox, instance, resources, home, make_job, tmp_path, monkeypatch):
    """A finished job (11 validated rows, 1 dead letter) whose spec is outside the jobs folder."""
    spec = make_job(name="exp", rows=ROWS, canary_first=False, retries={"per_item": 1, "spend_cap_share": 1.0})
    report = run_job(spec, instance, resources)
    assert report["succeeded"] == 11 and report["dead_lettered"] == 1, report
    remember_spec(spec, Store(home))  # as `batch-pipeline run PATH` does
    monkeypatch.setenv("BATCH_PIPELINE_JOBS", str(tmp_path / "no-jobs-here"))
    monkeypatch.chdir(tmp_path)
    return spec


def _validated(home, spec) -> pl.DataFrame:
    return pl.read_parquet(Store(home).local_path(JobPaths(spec.name).validated))


def test_export_openai_batch_writes_output_and_error_files_by_name(done, home, tmp_path, capsys):
    assert main(["export", "exp", "--format", "openai-batch", "--home", str(home)]) == 0
    out, errors = tmp_path / "exp.batch_output.jsonl", tmp_path / "exp.batch_output.errors.jsonl"
    assert f"11 validated rows exported as openai-batch to {out}; dead letters to {errors}" in capsys.readouterr().out
    validated = _validated(home, done)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [x["custom_id"] for x in lines] == validated["source_key"].to_list()
    for line in lines:
        assert line["error"] is None and line["response"]["status_code"] == 200
        validate_spec("CreateChatCompletionResponse", line["response"]["body"])
    back = parse_output_block(out.read_bytes())  # reads back through our own OpenAI output parser
    assert dict(
        zip(back.column("request_id").to_pylist(), back.column("output_text").to_pylist(), strict=True)
    ) == dict(zip(validated["source_key"], validated["output_text"], strict=True))
    assert back.column("input_tokens").to_pylist() == validated["input_tokens"].to_list()
    dead = parse_output_block(errors.read_bytes())
    assert dead.num_rows == 1 and dead.column("error_code").to_pylist() == ["context_length_exceeded"]


@pytest.mark.parametrize("fmt", ["parquet", "csv", "jsonl"])
def test_export_plain_formats_by_path_hold_the_validated_table(done, home, tmp_path, fmt):
    out = tmp_path / "out" / f"t.{fmt}"
    assert main(["export", done.source_path, "--format", fmt, "--out", str(out), "--home", str(home)]) == 0
    validated = _validated(home, done)
    if fmt == "parquet":
        assert pl.read_parquet(out).equals(validated)
    elif fmt == "csv":
        rows = list(csv.DictReader(out.open()))
        assert [r["source_key"] for r in rows] == validated["source_key"].to_list()
        assert [float(r["cost_usd"]) for r in rows] == pytest.approx(validated["cost_usd"].to_list())
    else:
        assert pl.read_ndjson(out).select(validated.columns).equals(validated)
    assert not list(out.parent.glob(".*tmp*"))  # written through a temporary name, nothing left behind


def test_report_prints_the_table_and_the_plot_path(done, home, capsys):
    for job in ("exp", done.source_path):
        assert main(["report", job, "--home", str(home)]) == 0
        out = capsys.readouterr().out
        assert "job exp: summary" in out
        rows = {ln.split("│")[1].strip(): ln.split("│")[2].strip() for ln in out.splitlines() if ln.count("│") == 3}
        assert rows["succeeded"] == "11" and rows["dead-lettered"] == "1" and rows["shards"] == "2", rows
        png = Store(home).local_path(JobPaths("exp").report_png)
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"plot (spend over time): {png}" in out


def test_export_and_report_before_a_run_exit_2(make_job, home, capsys):
    spec = make_job(name="fresh")
    assert main(["export", spec.source_path, "--home", str(home)]) == 2
    assert "no validated table" in capsys.readouterr().out
    assert main(["report", spec.source_path, "--home", str(home)]) == 2
    assert "no report" in capsys.readouterr().out


def test_the_summary_of_a_remote_home_says_how_to_query_the_parquet_in_place():
    import io

    from rich.console import Console

    from batch_pipeline.cli_outputs import print_summary

    uri = "s3://bucket/prefix/jobs/exp/validated/exp.parquet"
    buf = io.StringIO()
    print_summary(
        {"job": "exp", "complete": True, "outputs": {"validated": uri, "duckdb": ""}},
        Console(file=buf, width=400, soft_wrap=True),
    )
    out = buf.getvalue()
    assert "│ DuckDB file" not in out  # no empty row for a file that does not exist
    assert "INSTALL httpfs; LOAD httpfs; CREATE SECRET (TYPE s3, PROVIDER credential_chain)" in out
    assert f"SELECT * FROM read_parquet('{uri}') LIMIT 10" in out
    local = io.StringIO()
    print_summary(
        {"job": "exp", "complete": True, "outputs": {"validated": "/h/v.parquet", "duckdb": "/h/exp.duckdb"}},
        Console(file=local, width=400),
    )
    assert "/h/exp.duckdb" in local.getvalue() and "httpfs" not in local.getvalue()


def _summary_rows(out: str) -> dict[str, str]:
    return {ln.split("│")[1].strip(): ln.split("│")[2].strip() for ln in out.splitlines() if ln.count("│") == 3}


def test_a_resumed_run_s_summary_gives_the_job_s_input_rows_and_how_many_are_new(
    done, instance, resources, home, capsys
):
    from pathlib import Path

    assert main(["report", "exp", "--home", str(home)]) == 0
    first = _summary_rows(capsys.readouterr().out)
    assert (first["input rows"], first["new input rows (this run)"], first["unique requests"]) == ("12", "12", "12")
    report = run_job(done, instance, resources)  # a resume: the manifest reads nothing new
    assert (report["input_rows"], report["new_input_rows"], report["unique_requests"]) == (12, 0, 12), report
    assert main(["report", "exp", "--home", str(home)]) == 0
    again = _summary_rows(capsys.readouterr().out)
    assert (again["input rows"], again["new input rows (this run)"], again["rejected rows"]) == ("12", "0", "0")
    # new data lands: a new file of two rows, one of them broken JSON
    more = Path(done.input.path).parent / "more.jsonl"
    more.write_text(
        json.dumps({"ticket_id": "T99", "subject": "new", "body": "Where is my invoice?"})
        + '\n{"ticket_id": "T100", "body": "cut off\n'
    )
    report = run_job(done, instance, resources)
    assert (report["input_rows"], report["new_input_rows"], report["rejected_rows"], report["unique_requests"]) == (
        14,
        2,
        1,
        13,
    ), report
    assert main(["report", "exp", "--home", str(home)]) == 0
    last = _summary_rows(capsys.readouterr().out)
    assert (last["input rows"], last["new input rows (this run)"], last["rejected rows"]) == ("14", "2", "1"), last
    assert last["cost (USD)"].startswith("$") and last["duplicates collapsed"] == "0", last
