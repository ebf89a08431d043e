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


def test_a_broken_unrelated_spec_does_not_break_a_run(sandbox, sandbox_proc, make_job, home, tmp_path):
    import os
    import subprocess
    import sys

    spec = make_job()
    jobs = tmp_path / "data" / "jobs"
    (jobs / "broken.yaml").write_text("name: Not A Valid Name\nbackend: {}\n")  # someone else's half-written job
    env = {**os.environ, "BATCH_PIPELINE_JOBS": str(jobs), "DAGSTER_HOME": str(tmp_path / "dh"),
           "BATCH_PIPELINE_SANDBOX_URL": sandbox_proc[1]}
    done = subprocess.run([sys.executable, "-m", "batch_pipeline.cli", "run", spec.source_path, "--home", str(home)],
                          env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "broken.yaml" not in done.stdout + done.stderr
