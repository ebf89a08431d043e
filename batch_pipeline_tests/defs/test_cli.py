"""`batch-pipeline status` prints the per-shard reconciliation; errors are one clear line, not a traceback."""

from batch_pipeline.cli import main
from batch_pipeline.defs.pipeline import run_job


def test_status_prints_every_shard_balanced(sandbox, instance, resources, home, make_job, capsys):
    spec = make_job()
    run_job(spec, instance, resources)
    capsys.readouterr()
    assert main(["status", spec.source_path, "--home", str(home)]) == 0
    out = capsys.readouterr().out
    for shard in ("s00001", "s00002", "s00003", "s00004"):
        assert shard in out
    assert "total" in out and "40" in out and "False" not in out


def test_status_of_a_job_never_run_says_so(make_job, home, capsys):
    spec = make_job()
    assert main(["status", spec.source_path, "--home", str(home)]) == 1
    assert "no manifest" in capsys.readouterr().out


def test_a_bad_spec_is_reported_with_file_and_field(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: Bad Name\n")
    assert main(["run", str(bad)]) == 2
    out = capsys.readouterr().out
    assert "bad.yaml" in out and "name" in out and "Traceback" not in out
