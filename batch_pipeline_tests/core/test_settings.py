"""One settings object for every BATCH_PIPELINE_* variable: one default each, errors that name the variable."""

import ast
from datetime import timedelta
from pathlib import Path

import pytest

from batch_pipeline.core.errors import ConfigError
from batch_pipeline.core.settings import PROJECT_ROOT, K8sSettings, Settings
from batch_pipeline.core.store import Store


def test_defaults_when_nothing_is_set(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = Settings.from_env({})
    assert s.home == str(tmp_path / ".batch_pipeline")
    assert s.jobs == PROJECT_ROOT / "data" / "jobs" and s.prices == PROJECT_ROOT / "data" / "prices.yaml"
    assert (s.sensor_interval_s, s.shards_per_run, s.lease_ttl_s) == (30, 50, None)
    assert s.prices.is_file() and (s.jobs / "demo.yaml").is_file()  # the defaults point at the checkout's files


def test_the_store_of_the_settings_has_their_root_and_lease_ttl(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plain = Store.of(Settings.from_env({}))
    assert Path(plain.root) == tmp_path / ".batch_pipeline" and plain.lease_ttl == timedelta(minutes=15)
    other = Store.of(Settings.from_env({"BATCH_PIPELINE_HOME": "elsewhere", "BATCH_PIPELINE_LEASE_TTL_S": "4"}))
    assert Path(other.root).resolve() == tmp_path / "elsewhere" and other.lease_ttl == timedelta(seconds=4)
    assert Settings.from_env({}).with_home("rel").home == str(tmp_path / "rel")  # --home: made absolute
    assert Settings.from_env({}).with_home("s3://b/p").home == "s3://b/p"


def test_the_kubernetes_settings_come_from_their_variables():
    k8s = Settings.from_env(
        {
            "BATCH_PIPELINE_EXECUTOR": "K8S",
            "BATCH_PIPELINE_K8S_NAMESPACE": "team-a",
            "BATCH_PIPELINE_K8S_ENV_VARS": " A, B ,",
            "BATCH_PIPELINE_STEP_GRACE_S": "300",
            "BATCH_PIPELINE_GPU_SHM": "16Gi",
        }
    ).k8s
    assert (k8s.executor, k8s.namespace, k8s.env_vars, k8s.step_grace_s, k8s.gpu_shm) == (
        "k8s",
        "team-a",
        ("A", "B"),
        300,
        "16Gi",
    )
    assert Settings.from_env({}).k8s == K8sSettings()  # one default each, in one place
    with pytest.raises(ConfigError, match="BATCH_PIPELINE_EXECUTOR='docker'"):
        Settings.from_env({"BATCH_PIPELINE_EXECUTOR": "docker"})
    with pytest.raises(ConfigError, match="BATCH_PIPELINE_STEP_GRACE_S='soon'"):
        Settings.from_env({"BATCH_PIPELINE_STEP_GRACE_S": "soon"})


# the edges of a process: the CLI command, the code location's load, a Component's load
EDGES = {
    ("batch_pipeline/cli_jobs.py", "cli_settings"),
    ("batch_pipeline/defs/project.py", "project_definitions"),
    ("batch_pipeline/defs/component.py", "build_defs"),
}


def from_env_calls(root: Path) -> set[tuple[str, str]]:
    """(file, enclosing function) of every ``Settings.from_env(...)`` call under ``root``."""
    found = set()
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "from_env":
                    found.add((path.relative_to(root.parent).as_posix(), fn.name))
        module_level = [n for n in tree.body if not isinstance(n, ast.FunctionDef | ast.ClassDef)]
        for stmt in module_level:
            for node in ast.walk(stmt):
                if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "from_env":
                    found.add((path.relative_to(root.parent).as_posix(), "<module>"))
    return found


def test_the_environment_is_read_only_at_the_edges(tmp_path):
    calls = from_env_calls(PROJECT_ROOT / "batch_pipeline") - {("batch_pipeline/core/settings.py", "from_env")}
    assert calls == EDGES
    planted = tmp_path / "batch_pipeline" / "deep.py"  # the check fails on a read below the edges
    planted.parent.mkdir()
    planted.write_text("INTERVAL = Settings.from_env().sensor_interval_s\ndef f():\n    return Settings.from_env()\n")
    assert from_env_calls(tmp_path / "batch_pipeline") == {
        ("batch_pipeline/deep.py", "<module>"),
        ("batch_pipeline/deep.py", "f"),
    }


def test_values_come_from_the_environment():
    s = Settings.from_env(
        {
            "BATCH_PIPELINE_HOME": "s3://bucket/prefix",
            "BATCH_PIPELINE_SENSOR_INTERVAL_S": "5",
            "BATCH_PIPELINE_LEASE_TTL_S": "2.5",
            "BATCH_PIPELINE_SHARDS_PER_RUN": " 7 ",
        }
    )
    assert (s.home, s.sensor_interval_s, s.lease_ttl_s, s.shards_per_run) == ("s3://bucket/prefix", 5, 2.5, 7)


@pytest.mark.parametrize(
    ("name", "value"), [("SENSOR_INTERVAL_S", "soon"), ("LEASE_TTL_S", "0"), ("SENSOR_INTERVAL_S", "-3")]
)
def test_a_bad_value_names_the_variable(name, value):
    with pytest.raises(ConfigError, match=f"BATCH_PIPELINE_{name}='{value}'"):
        Settings.from_env({f"BATCH_PIPELINE_{name}": value})
