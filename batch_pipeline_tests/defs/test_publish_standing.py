"""A finished job run again keeps its published tables: no publish run, no item or result read
(``core/publish/current.py``); anything that would change them (a refreshed summary, new input, an edited spec, a
missing table) publishes again."""

import os

import yaml

from batch_pipeline.cli import main
from batch_pipeline.core.run.summary import ShardSummaries
from batch_pipeline.core.spec.loading import load_spec
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline.defs.assets import asset_key
from batch_pipeline.defs.pipeline import run_job


def _latest(instance, spec, name: str) -> int:
    records = instance.fetch_materializations(asset_key(spec, name), limit=1).records
    assert records, name
    return records[0].storage_id


def test_a_finished_job_run_again_reads_no_result_and_keeps_its_tables(sandbox, instance, resources, home, make_job):
    spec = make_job()
    first = run_job(spec, instance, resources)
    assert first["complete"]
    paths, store = JobPaths(spec.name), Store(home)
    published = {n: _latest(instance, spec, n) for n in ("results", "validated", "report")}
    validated = (home / paths.validated).read_bytes()
    # the results are unreadable now (same size and mtime, so the listing is as the publish left it): a run that
    # read them would find no result at all, and its reconciliation check would fail the publish
    parts = sorted((home / paths.results).rglob("*.parquet"))
    assert parts
    kept = {p: (p.read_bytes(), p.stat()) for p in parts}
    for p, (data, st) in kept.items():
        p.write_bytes(b"x" * len(data))
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    try:
        again = run_job(spec, instance, resources)
    finally:
        for p, (data, st) in kept.items():
            p.write_bytes(data)
            os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert again["complete"] and again["passes"] == 0
    assert {n: _latest(instance, spec, n) for n in published} == published  # no publish run
    assert (home / paths.validated).read_bytes() == validated
    # the report is the publish's, brought up to this run's manifest (which read nothing new)
    same = {k for k in first if k not in ("manifest_generation", "new_input_rows", "passes")}
    assert {k: again[k] for k in same} == {k: first[k] for k in same}
    assert again["new_input_rows"] == 0 and again["manifest_generation"] == first["manifest_generation"] + 1
    assert store.read_json(paths.report)["manifest_generation"] == again["manifest_generation"]
    # a result part written behind the summaries' back: the publish (and its reconciliation check) runs again
    extra = parts[0].with_name("attempt-0099-flush-00001-00000000.parquet")
    extra.write_bytes(kept[parts[0]][0])
    try:
        run_job(spec, instance, resources)
    except Exception as exc:  # dg.Failure: the reconciliation check saw the extra rows
        assert "reconciliation" in str(exc) or "check" in str(exc), exc
    finally:
        extra.unlink()
    assert _latest(instance, spec, "results") > published["results"]
    assert run_job(spec, instance, resources)["complete"]  # the part is gone again: published once more
    settled = _latest(instance, spec, "validated")
    assert run_job(spec, instance, resources)["complete"] and _latest(instance, spec, "validated") == settled
    # a shard's summary moved since: the publish runs again
    ShardSummaries(spec, store).refresh("s00002")
    assert run_job(spec, instance, resources)["complete"]
    assert _latest(instance, spec, "validated") > settled


def test_status_says_done_after_a_run_that_kept_the_tables(sandbox, instance, resources, home, make_job, capsys):
    spec = make_job()
    run_job(spec, instance, resources)
    run_job(spec, instance, resources)  # kept the tables
    capsys.readouterr()
    assert main(["status", spec.source_path, "--home", str(home)]) == 0
    assert "done: published at" in capsys.readouterr().out


def test_an_edited_spec_or_a_missing_table_publishes_again(sandbox, instance, resources, home, make_job):
    spec = make_job()
    run_job(spec, instance, resources)
    before = _latest(instance, spec, "validated")
    (home / JobPaths(spec.name).validated).unlink()
    run_job(spec, instance, resources)
    after = _latest(instance, spec, "validated")
    assert after > before and (home / JobPaths(spec.name).validated).exists()
    with open(spec.source_path) as f:
        raw = yaml.safe_load(f)
    raw["budget_usd"] = raw["budget_usd"] * 2  # no request changes, but the spec the publish read did
    with open(spec.source_path, "w") as f:
        yaml.safe_dump(raw, f)
    edited = load_spec(spec.source_path)
    run_job(edited, instance, resources)
    assert _latest(instance, edited, "validated") > after


def _runs(dagster_home) -> int:
    import dagster as dg

    with dg.DagsterInstance.from_config(str(dagster_home)) as inst:
        return len(inst.get_runs())


def test_the_cli_runs_a_finished_job_again_without_a_dagster_run(
    sandbox, home, make_job, tmp_path, monkeypatch, capsys
):
    from batch_pipeline.core.ledger.control import JobControl
    from batch_pipeline.core.manifest.read import Manifest

    dagster_home = tmp_path / "dagster_home"
    monkeypatch.setenv("DAGSTER_HOME", str(dagster_home))
    spec = make_job()
    args = ["run", spec.source_path, "--home", str(home)]
    assert main(args) == 0
    first = capsys.readouterr().out
    runs, generation = _runs(dagster_home), Manifest(spec.name, Store(home)).last_generation()
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "> nothing to do: no input changed, every shard is settled and nothing changed since the publish at " in out
    assert _runs(dagster_home) == runs  # no manifest run, no publish run
    assert Manifest(spec.name, Store(home)).last_generation() == generation  # no manifest generation either
    new_rows = next(ln for ln in out.splitlines() if "new input rows (this run)" in ln)
    assert new_rows.strip("│ ").endswith(" 0"), new_rows
    succeeded = next(ln for ln in first.splitlines() if "succeeded" in ln)
    assert succeeded in out  # the same summary as the publish's
    # a pause to lift is something to do: the ordinary run lifts it and goes on (to the same tables)
    JobControl(Store(home), spec.name).pause("deploy")
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "resuming: the job was paused" in out and "nothing to do" not in out and _runs(dagster_home) > runs
    # a new row in the input: the manifest reads it
    runs = _runs(dagster_home)
    with open(spec.input.path.replace("*.jsonl", "rows.jsonl"), "a") as f:
        f.write('{"ticket_id": "T-new", "subject": "Refund", "body": "Please refund my last invoice."}\n')
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "nothing to do" not in out and _runs(dagster_home) > runs
    assert main(args) == 0 and "nothing to do" in capsys.readouterr().out
