"""The dg project: each job a ``batch_pipeline.BatchInferenceJob`` Component in ``batch_pipeline/jobs/<job>/defs.yaml``.

``dg list defs``, ``dg check yaml``, ``dg check defs``, ``dg scaffold defs`` and ``dg dev`` run as real
subprocesses on a copy of the project in a temp folder (the package, data/, pyproject.toml: a scaffold or a broken
``defs.yaml`` never touches the checkout), with that copy first on PYTHONPATH. ``dg dev`` is stopped by its PID as
``dagster dev`` is in the e2e tier.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest
import requests
import yaml

from batch_pipeline.cli_jobs import cli_settings, resolve_job
from batch_pipeline.core.errors import ConfigError
from batch_pipeline.core.manifest.read import Manifest
from batch_pipeline.core.manifest.shards import build_manifest
from batch_pipeline.core.settings import Settings
from batch_pipeline.core.spec.job_files import DEFS_FOLDER, load_defs_yaml, load_job_file
from batch_pipeline.core.spec.loading import load_spec
from batch_pipeline.core.store import Store
from batch_pipeline.defs.build import build_definitions
from batch_pipeline.defs.component import BatchInferenceJob
from batch_pipeline.defs.project import not_declared, project_definitions
from batch_pipeline_tests.e2e.conftest import STARTUP_TIMEOUT_S, GraphQL, _alive, _descendants, _stop, free_port

REPO = Path(__file__).resolve().parents[2]
DG = str(Path(sys.executable).with_name("dg"))
DEMO_SPEC = REPO / "data" / "jobs" / "demo.yaml"
DEMO_DEFS = DEFS_FOLDER / "demo" / "defs.yaml"
TIMEOUT_S = 600  # a bound, not a timing: `dg` imports the project in a fresh interpreter, slow on a loaded box

pytestmark = pytest.mark.slow


def copy_project(root: Path) -> Path:
    """The checkout's dg project (package, data, pyproject.toml, dagster.yaml) under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    for name in ("pyproject.toml", "workspace.yaml", "dagster.yaml"):
        shutil.copy(REPO / name, root / name)
    shutil.copytree(REPO / "data", root / "data")
    shutil.copytree(
        REPO / "batch_pipeline", root / "batch_pipeline", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    (root / "dagster_home").mkdir()
    return root


def project_env(root: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCH_PIPELINE_") and k != "DAGSTER_HOME"}
    return {
        **env,
        "PYTHONPATH": str(root),  # the copy's package, not the checkout's (installed editable)
        "DAGSTER_HOME": str(root / "dagster_home"),
        "BATCH_PIPELINE_HOME": str(root / "home"),
        "DAGSTER_DISABLE_TELEMETRY": "1",
        **extra,
    }


def run_dg(root: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [DG, *args], cwd=root, env=project_env(root, **env), capture_output=True, text=True, timeout=TIMEOUT_S
    )


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A copy of the project, with ``triage`` scaffolded into its defs folder by ``dg scaffold defs``."""
    root = copy_project(tmp_path_factory.mktemp("dg") / "project")
    out = run_dg(root, "scaffold", "defs", "batch_pipeline.BatchInferenceJob", "triage")
    assert out.returncode == 0, out.stdout + out.stderr
    return root


@pytest.fixture
def broken(tmp_path) -> Path:
    return copy_project(tmp_path / "project")


def listed(root: Path) -> dict:
    out = run_dg(root, "list", "defs", "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout[out.stdout.index("{") :])


# -- the Component and its definitions ---------------------------------------------------------------------------
def demo_component() -> BatchInferenceJob:
    """The checkout's defs folder loaded as dg loads it; its demo Component."""
    tree = dg.ComponentTree.for_project(REPO)
    return next(c for c in tree.get_all_components(of_type=BatchInferenceJob) if c.name == "demo")


def test_the_demo_component_builds_what_its_data_jobs_spec_builds():
    """The defs folder's demo and data/jobs/demo.yaml are one job: the same spec, the same assets, checks, jobs."""
    component = demo_component()
    legacy = load_spec(DEMO_SPEC)
    assert isinstance(component, BatchInferenceJob) and component.source_path == str(DEMO_DEFS)
    assert not_declared([legacy], [component]) == []  # the same spec: declared once

    def shape(defs):
        return (
            sorted(k.to_user_string() for a in defs.assets for k in a.keys),
            sorted(str(k) for c in defs.asset_checks for k in c.check_keys),
            sorted(j.name for j in defs.jobs),
            sorted(s.name for s in defs.sensors),
            sorted(s.name for s in defs.schedules),
        )

    assert shape(build_definitions([component])) == shape(build_definitions([legacy]))
    assert shape(project_definitions(Settings.from_env({}))) == shape(build_definitions([legacy]))


def test_a_job_declared_in_both_places_with_different_specs_is_refused(tmp_path):
    legacy = load_spec(DEMO_SPEC)
    other = demo_component().model_copy(update={"budget_usd": 6.0})
    with pytest.raises(ConfigError, match="declared twice with different specs") as err:
        not_declared([legacy], [other])
    assert str(DEMO_SPEC) in str(err.value) and str(DEMO_DEFS) in str(err.value)


def test_the_demo_has_the_same_request_and_shard_ids_from_either_file(tmp_path):
    """Nothing a user sees changes with the layout: the manifest of each spec file has the same request IDs, source
    keys and shard IDs."""
    tables = []
    for n, spec in enumerate((load_spec(DEMO_SPEC), load_job_file(DEMO_DEFS))):
        store = Store(str(tmp_path / f"home{n}"))
        build_manifest(spec, store)
        manifest = Manifest(spec.name, store)
        index = manifest.item_index(["request_id", "shard_id"]).sort_by("request_id").to_pylist()
        rows = manifest.rows().select(["source", "line", "source_key", "request_id"]).sort_by("request_id").to_pylist()
        tables.append((manifest.shard_ids(), index, rows))
    assert tables[0] == tables[1]
    assert len(tables[0][0]) > 1 and len(tables[0][1]) > 1000


def test_the_cli_finds_a_defs_folder_job_by_name_and_reads_a_defs_yaml_by_path(project, monkeypatch, tmp_path):
    monkeypatch.setenv("BATCH_PIPELINE_JOBS", str(tmp_path / "no_jobs"))  # not in the jobs folder
    settings = cli_settings(str(tmp_path / "home"))
    spec = resolve_job("demo", settings)
    assert spec.source_path == str(DEMO_DEFS) and spec.input.path == str(REPO / "data/samples/tickets/*.jsonl")
    triage = project / "batch_pipeline" / "jobs" / "triage" / "defs.yaml"
    by_path = resolve_job(str(triage), settings)
    assert by_path.name == "triage" and by_path.input.path == str(project / "data/samples/tickets_small/*.jsonl")
    with pytest.raises(ConfigError, match="in the defs folder"):
        resolve_job("nope", settings)


def test_a_broken_defs_yaml_read_by_the_cli_names_its_file_line_and_field(tmp_path):
    text = DEMO_DEFS.read_text().replace("  text_field: body", "  text_feld: body", 1)
    path = tmp_path / "demo" / "defs.yaml"
    path.parent.mkdir()
    path.write_text(text)
    line = next(n for n, ln in enumerate(text.splitlines(), 1) if "text_feld" in ln)
    with pytest.raises(ConfigError) as err:
        load_defs_yaml(path)
    assert str(path) in str(err.value)
    assert f"line {line}, field 'attributes.input.text_feld': unknown key" in str(err.value), err.value


# -- dg, as a user runs it -----------------------------------------------------------------------------------------
def test_dg_list_defs_shows_every_job_of_the_defs_folder(project):
    listing = listed(project)
    keys = {a["asset_key"] for a in listing["assets"]}
    demo = {k.to_user_string() for a in build_definitions([load_spec(DEMO_SPEC)]).assets for k in a.keys}
    assert demo <= keys  # the demo's asset keys, unchanged
    assert {f"triage/{a}" for a in ("manifest", "quote", "submissions", "shard_results", "validated")} <= keys
    sources = {a["asset_key"]: a.get("source", "") for a in listing["assets"]}
    assert sources["triage/manifest"].startswith("batch_pipeline/jobs/triage/defs.yaml"), sources["triage/manifest"]
    assert {"demo_prepare", "triage_prepare", "triage_shards"} <= {j["name"] for j in listing["jobs"]}
    assert {"demo_new_data", "triage_shard_driver"} <= {s["name"] for s in listing["sensors"]}


def test_dg_check_yaml_and_check_defs_pass_on_the_project(project):
    for args in (("check", "yaml"), ("check", "defs")):
        out = run_dg(project, *args)
        assert out.returncode == 0, out.stdout + out.stderr


def test_dg_checks_fail_on_an_unknown_key_naming_the_file_line_and_field(broken):
    path = broken / "batch_pipeline" / "jobs" / "demo" / "defs.yaml"
    text = path.read_text().replace("  text_field: body", "  text_feld: body", 1)
    path.write_text(text)
    line = next(n for n, ln in enumerate(text.splitlines(), 1) if "text_feld" in ln)
    for args in (("check", "yaml"), ("check", "defs")):
        out = run_dg(broken, *args)
        said = out.stdout + out.stderr
        assert out.returncode != 0, said
        assert f"{path}:{line}" in said and "attributes.input.text_feld" in said, said


def test_dg_check_defs_fails_on_a_spec_rule_naming_the_file_line_and_field(broken):
    """A rule of the spec the YAML schema cannot say (max_tokens below the shortest answer): `dg check yaml` lets it
    through, `dg check defs` loads the Component and fails at the field's line, with the spec's own message."""
    path = broken / "batch_pipeline" / "jobs" / "demo" / "defs.yaml"
    text = path.read_text().replace("max_tokens: 16}", "max_tokens: 1}", 1)
    path.write_text(text)
    line = next(n for n, ln in enumerate(text.splitlines(), 1) if "max_tokens: 1}" in ln)
    out = run_dg(broken, "check", "defs")
    said = out.stdout + out.stderr
    assert out.returncode != 0, said
    assert f"{path}:{line}" in said and "attributes.sampling.max_tokens" in said, said
    assert "cannot fit the shortest valid answer" in said, said


def test_a_scaffolded_job_runs_on_the_sandbox_as_it_is(project, sandbox, sandbox_proc):
    """`dg scaffold defs batch_pipeline.BatchInferenceJob triage` wrote a spec that runs unedited: every ticket of
    the small sample answered through the sandbox's OpenAI Batch API, validated and published. (``sandbox`` resets
    the worker's sandbox first: a quota scenario an earlier test set refused this job's batch.)"""
    _, url = sandbox_proc
    env = project_env(project, BATCH_PIPELINE_SANDBOX_URL=url)
    out = subprocess.run(
        [sys.executable, "-m", "batch_pipeline.cli", "run", "triage"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads((project / "home" / "jobs" / "triage" / "report.json").read_text())
    rows = sum(1 for _ in (project / "data" / "samples" / "tickets_small" / "tickets.jsonl").open())
    assert report["complete"] is True and report["succeeded"] == rows, {k: report.get(k) for k in ("complete",)}
    assert (project / "home" / "jobs" / "triage" / "validated" / "triage.parquet").is_file()


def test_dg_dev_starts_serves_the_components_and_stops_by_pid(project):
    port = free_port()
    log_path = project / "dg_dev.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [DG, "dev", "--host", "127.0.0.1", "--port", str(port)],
            cwd=project,
            env=project_env(project),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        seen: dict = {}
        gql = GraphQL(f"http://127.0.0.1:{port}/graphql")
        try:
            deadline = time.monotonic() + STARTUP_TIMEOUT_S * 2
            nodes = None
            while nodes is None:
                assert proc.poll() is None, f"dg dev exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}"
                seen.update(_descendants(proc.pid))
                try:
                    found = gql("query { assetNodes { assetKey { path } } }")["assetNodes"]
                    if found:
                        nodes = found
                except (requests.RequestException, AssertionError, ValueError):
                    pass
                assert time.monotonic() < deadline, f"dg dev did not serve:\n{log_path.read_text()[-4000:]}"
                time.sleep(0.5)
            keys = {"/".join(n["assetKey"]["path"]) for n in nodes}
            assert {"demo/manifest", "demo/report", "triage/manifest", "triage/validated"} <= keys, sorted(keys)
        finally:
            seen.update(_descendants(proc.pid))
            _stop(proc, seen)
    assert proc.returncode is not None
    assert not _alive(seen), f"dg dev left processes behind: {_alive(seen)}"


def test_the_scaffolder_refuses_a_folder_name_that_is_not_a_job_name(broken):
    out = run_dg(broken, "scaffold", "defs", "batch_pipeline.BatchInferenceJob", "Bad-Name")
    assert out.returncode != 0
    assert "is not a job name" in out.stdout + out.stderr, out.stdout + out.stderr
    assert yaml.safe_load((broken / "batch_pipeline" / "jobs" / "demo" / "defs.yaml").read_text())["type"]
