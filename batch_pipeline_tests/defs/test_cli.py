"""`batch-pipeline status` prints the per-shard reconciliation; errors are one clear line, not a traceback."""

import os
from pathlib import Path

from batch_pipeline.cli import main
from batch_pipeline.defs.pipeline import run_job


def _row(out: str, first: str) -> list[str]:
    line = next(ln for ln in out.splitlines() if ln.strip("│┃ ").startswith(first))
    return [c.strip() for c in line.replace("┃", "│").split("│") if c.strip()]


def test_status_prints_every_shard_balanced(sandbox, instance, resources, home, make_job, capsys):
    from datetime import UTC, datetime

    spec = make_job(retries={"per_item": 3, "spend_cap_share": 1.0})
    started = datetime.now(UTC).replace(microsecond=0)
    run_job(spec, instance, resources)
    capsys.readouterr()
    assert main(["status", spec.source_path, "--home", str(home), "--all"]) == 0
    out = capsys.readouterr().out
    for shard in ("s00001", "s00002", "s00003", "s00004"):
        row = _row(out, shard)
        assert row[1] == "settled" and row[2] == "10" and row[3] == "10" and row[-1] == "True", row
    total = _row(out, "total")
    assert total[:6] == ["total", "40", "40", "0", "0", "0"] and total[-1] == "True", total
    # published: the job is done, and says when (not "next: publish", which it already did)
    assert "next: publish" not in out
    done = next(ln for ln in out.splitlines() if ln.startswith("done: published at "))
    when = datetime.fromisoformat(done.removeprefix("done: published at ").split(": ", 1)[0])
    assert started <= when <= datetime.now(UTC), done
    assert "40 answered, 0 dead-lettered, in " in done and "validated" in done, done
    # without --all a finished job shows its totals, not 4 settled rows
    assert main(["status", spec.source_path, "--home", str(home)]) == 0
    brief = capsys.readouterr().out
    assert "4 settled" in brief and "s00002" not in brief and "(4 settled shards: --all shows them)" in brief
    assert "done: published at" in brief
    # a shard's state changed after that publish: publishing is what comes next again
    from batch_pipeline.core.run.summary import ShardSummaries
    from batch_pipeline.core.store import Store

    ShardSummaries(spec, Store(home)).refresh("s00002")
    assert main(["status", spec.source_path, "--home", str(home)]) == 0
    assert "next: publish" in (again := capsys.readouterr().out) and "done:" not in again


def test_status_shows_what_waits_and_why(sandbox, instance, resources, home, make_job, capsys):
    import dagster as dg

    from batch_pipeline.core.ledger.control import JobControl
    from batch_pipeline.core.store import Store
    from batch_pipeline.defs.build import build_definitions

    spec = make_job()
    defs = build_definitions([spec], resources)
    dg.materialize(
        [*defs.assets, *defs.asset_checks],
        instance=instance,
        resources=defs.resources,
        selection=[dg.AssetKey([spec.name, "manifest"])],
    )
    JobControl(Store(home), spec.name).stop("bad key", code="invalid_api_key")
    assert main(["status", spec.source_path, "--home", str(home)]) == 0
    out = capsys.readouterr().out
    assert _row(out, "s00001")[1] == "stopped" and "job stopped at" in out and "bad key" in out
    # the reason's meaning and the command that fixes it
    assert "means: the provider refused the key" in out
    assert (
        "fix: export the right key in the variable `backend.settings.api_key_env` names (default "
        f"`OPENAI_API_KEY`), then `batch-pipeline resume {spec.name}`"
    ) in out
    total = _row(out, "total")
    assert total[:6] == ["total", "40", "0", "0", "40", "0"] and total[-1] == "True", total


def test_status_of_a_job_never_run_says_so(make_job, home, capsys):
    spec = make_job()
    assert main(["status", spec.source_path, "--home", str(home)]) == 2
    assert "no manifest" in capsys.readouterr().out


def test_a_bad_spec_is_reported_with_file_and_field(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: Bad Name\n")
    assert main(["run", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.yaml" in err and "name" in err and "Traceback" not in err


def test_a_broken_unrelated_spec_does_not_break_a_run(cli, sandbox, sandbox_proc, make_job, home, tmp_path):
    spec = make_job()
    jobs = tmp_path / "data" / "jobs"
    (jobs / "broken.yaml").write_text("name: Not A Valid Name\nbackend: {}\n")  # someone else's half-written job
    env = {
        **os.environ,
        "BATCH_PIPELINE_JOBS": str(jobs),
        "DAGSTER_HOME": str(tmp_path / "dh"),
        "BATCH_PIPELINE_SANDBOX_URL": sandbox_proc[1],
    }
    done = cli.run(["run", spec.source_path, "--home", str(home)], env=env, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    # at most a warning that it was left out of the multi-pass lookup, never an error or a stack trace
    mentions = [ln for ln in (done.stdout + done.stderr).splitlines() if "broken.yaml" in ln]
    assert all("does not load, left out" in ln for ln in mentions), mentions
    assert "Traceback" not in done.stderr


def test_a_bad_key_prints_one_line_and_the_fix_then_a_name_finds_the_spec_run_from_a_path(
    cli, sandbox, sandbox_proc, make_job, home, tmp_path
):
    spec = make_job(name="keyed")
    env = {
        **os.environ,
        "DAGSTER_HOME": str(tmp_path / "dh"),
        "BATCH_PIPELINE_SANDBOX_URL": sandbox_proc[1],
        "OPENAI_API_KEY": "sk-sandbox-bad",
        "BATCH_PIPELINE_JOBS": str(tmp_path / "elsewhere"),
    }
    done = cli.run(["run", spec.source_path, "--home", str(home)], env=env, timeout=180)
    assert done.returncode == 3, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert "Traceback" not in done.stderr and "Stack Trace" not in done.stderr and len(lines) <= 3, done.stderr
    assert lines[0].startswith("job keyed stopped (invalid_api_key): ") and "401" in lines[0], lines
    assert lines[1] == (
        "fix: export the right key in the variable `backend.settings.api_key_env` names (default "
        "`OPENAI_API_KEY`), then `batch-pipeline resume keyed`"
    ), lines
    assert "sk-sandbox-bad" not in done.stdout + done.stderr
    # the spec lives outside the jobs folder: the name finds it through the record the run left in the home
    status = cli.run(["status", "keyed", "--home", str(home)], env=env, timeout=120)
    assert status.returncode == 0, status.stdout + status.stderr
    assert "job stopped at" in status.stdout and "means: the provider refused the key" in status.stdout
    # the fix named above, by name: resume completes the same job
    resumed = cli.run(
        ["resume", "keyed", "--home", str(home)], env={**env, "OPENAI_API_KEY": "sk-sandbox"}, timeout=180
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resuming: the job was stopped" in resumed.stdout and "Traceback" not in resumed.stderr


def test_a_name_nowhere_to_be_found_names_both_places_looked(home, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BATCH_PIPELINE_JOBS", str(tmp_path / "jobs"))
    for command in ("run", "resume", "quote", "status", "pause", "replay", "export", "report"):
        assert main([command, "ghost", "--home", str(home)]) == 2, command
        err = capsys.readouterr().err
        assert "no job 'ghost'" in err and str(home / "jobs" / "ghost" / "spec_source.json") in err, err
        assert str(tmp_path / "jobs" / "ghost.yaml") in err, err


def test_a_recorded_spec_that_moved_away_is_named_as_gone(make_job, home, tmp_path, monkeypatch, capsys):
    from batch_pipeline.cli_jobs import remember_spec
    from batch_pipeline.core.store import Store

    spec = make_job(name="moved")
    remember_spec(spec, Store(home))
    monkeypatch.setenv("BATCH_PIPELINE_JOBS", str(tmp_path / "jobs-empty"))
    assert main(["status", "moved", "--home", str(home)]) == 2  # found by name: no manifest yet
    assert "no manifest" in capsys.readouterr().out
    Path(spec.source_path).rename(tmp_path / "moved-away.yaml")
    assert main(["status", "moved", "--home", str(home)]) == 2
    assert f"names {Path(spec.source_path).resolve()}, which is gone" in capsys.readouterr().err


def test_a_quote_over_the_budget_exits_3_with_the_budget_fix(sandbox, make_job, home, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dh"))
    spec = make_job(name="cheap", budget_usd=0.000001)
    assert main(["run", spec.source_path, "--home", str(home)]) == 3
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 2 and "Traceback" not in err, err
    assert lines[0].startswith("job cheap stopped (quote_within_budget): check quote_within_budget failed: "), lines
    assert lines[1] == "fix: raise `budget_usd` (or shrink the input), then `batch-pipeline run cheap`", lines
    assert sandbox.ledger() == []  # nothing was sent


def test_a_bug_in_a_run_exits_1_and_shows_its_stack_trace(cli, make_job, home, tmp_path):
    from batch_pipeline.core.manifest.shards import build_manifest
    from batch_pipeline.core.spec.paths import JobPaths
    from batch_pipeline.core.store import Store

    spec = make_job(name="buggy")
    store = Store(home)
    build_manifest(spec, store)
    store.write_json(JobPaths(spec.name).shard_summary("s00001"), [1])  # a record no code path writes
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "dh"), "BATCH_PIPELINE_SANDBOX_URL": "http://127.0.0.1:9"}
    done = cli.run(["run", spec.source_path, "--home", str(home)], env=env, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    # the summary is a typed record: reading it fails on its type, with the record's own error and stack trace
    assert "Traceback" in done.stderr and "ValidationError" in done.stderr, done.stderr


def test_a_cli_run_holds_its_starting_heap_frozen_and_thaws_it_when_it_ends(
    sandbox, make_job, home, tmp_path, monkeypatch
):
    """``batch-pipeline run`` keeps what it starts with out of the collector's full passes (``core/run/heap.py``) and
    hands the heap back thawed, after a finished run and after a stopped one (here, in-process, a test worker's)."""
    import gc
    import logging

    class FreezeCounts(logging.Handler):
        def __init__(self) -> None:
            super().__init__(logging.INFO)
            self.counts: list[int] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.counts.append(gc.get_freeze_count())

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dh"))
    seen = FreezeCounts()
    logger = logging.getLogger("batch_pipeline.core.run")
    monkeypatch.setattr(logger, "level", logging.INFO)
    logger.addHandler(seen)
    try:
        assert gc.get_freeze_count() == 0
        assert main(["run", make_job(name="frozen").source_path, "--home", str(home)]) == 0
        assert seen.counts and min(seen.counts) > 0  # the runner's log lines, written while the run went on
        assert gc.get_freeze_count() == 0
        assert main(["run", make_job(name="over", budget_usd=0.000001).source_path, "--home", str(home)]) == 3
        assert gc.get_freeze_count() == 0
    finally:
        logger.removeHandler(seen)
