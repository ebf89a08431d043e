"""`batch-pipeline status` prints the per-shard reconciliation; errors are one clear line, not a traceback."""

from batch_pipeline.cli import main
from batch_pipeline.defs.pipeline import run_job


def _row(out: str, first: str) -> list[str]:
    line = next(ln for ln in out.splitlines() if ln.strip("│┃ ").startswith(first))
    return [c.strip() for c in line.replace("┃", "│").split("│") if c.strip()]


def test_status_prints_every_shard_balanced(sandbox, instance, resources, home, make_job, capsys):
    spec = make_job(retries={"per_item": 3, "spend_cap_share": 1.0})
    run_job(spec, instance, resources)
    capsys.readouterr()
    assert main(["status", spec.source_path, "--home", str(home), "--all"]) == 0
    out = capsys.readouterr().out
    for shard in ("s00001", "s00002", "s00003", "s00004"):
        row = _row(out, shard)
        assert row[1] == "settled" and row[2] == "10" and row[3] == "10" and row[-1] == "True", row
    total = _row(out, "total")
    assert total[:6] == ["total", "40", "40", "0", "0", "0"] and total[-1] == "True", total
    assert "next: publish" in out
    # without --all a finished job shows its totals, not 4 settled rows
    assert main(["status", spec.source_path, "--home", str(home)]) == 0
    brief = capsys.readouterr().out
    assert "4 settled" in brief and "s00002" not in brief and "(4 settled shards: --all shows them)" in brief


def test_status_shows_what_waits_and_why(sandbox, instance, resources, home, make_job, capsys):
    from batch_pipeline.core.run.control import JobControl
    from batch_pipeline.core.store import Store
    from batch_pipeline.defs.build import build_definitions
    import dagster as dg

    spec = make_job()
    defs = build_definitions([spec], resources)
    dg.materialize([*defs.assets, *defs.asset_checks], instance=instance, resources=defs.resources,
                   selection=[dg.AssetKey([spec.name, "manifest"])])
    JobControl(Store(home), spec.name).stop("bad key", code="invalid_api_key")
    assert main(["status", spec.source_path, "--home", str(home)]) == 0
    out = capsys.readouterr().out
    assert _row(out, "s00001")[1] == "stopped" and "job stopped at" in out and "bad key" in out
    total = _row(out, "total")
    assert total[:6] == ["total", "40", "0", "0", "40", "0"] and total[-1] == "True", total


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
