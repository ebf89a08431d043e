"""k8s/helm/values.yaml parses, names only keys of the Dagster chart, and configures what we rely on."""

import dagster as dg
import pytest
import yaml

from batch_pipeline.core.settings import DEFAULT_ENV_SECRETS
from batch_pipeline.defs.k8s import parse_node_selector
from batch_pipeline_tests.k8s.support import (
    CHART_SCHEMA,
    HELM_VALUES,
    K8S_DIR,
    by_kind,
    chart_schema,
    load_docs,
    mutated,
    values_problems,
)


@pytest.fixture(scope="module")
def values() -> dict:
    return yaml.safe_load(HELM_VALUES.read_text())


def rename(new: str):
    return lambda parent, key: parent.__setitem__(new, parent.pop(key))


def replace(value):
    return lambda parent, key: parent.__setitem__(key, value)


def test_fixture_is_the_chart_schema_with_its_provenance():
    text = CHART_SCHEMA.read_text()
    assert "dagster-io/dagster" in text and "437f92d953812a3efdf5a464ba196eb3fcd9a777" in text
    assert "Apache License" in text
    schema = chart_schema()
    assert schema["title"] == "DagsterHelmValues"
    assert {"runLauncher", "dagster-user-deployments", "postgresql", "dagsterDaemon", "concurrency"} <= set(
        schema["properties"]
    )


def test_values_name_only_chart_keys_with_valid_values(values):
    assert values_problems(values) == []


@pytest.mark.parametrize(
    ("path", "change", "expected"),
    [
        # top level: the chart schema itself allows unknown keys here; our key check does not
        (["runLauncher"], rename("runLaucher"), "runLaucher: not a key of the chart"),
        # a user deployment: open in the schema too
        (
            ["dagster-user-deployments", "deployments", 0, "envSecrets"],
            rename("envSecret"),
            "dagster-user-deployments.deployments[0].envSecret: not a key of the chart",
        ),
        (
            ["dagster-user-deployments", "deployments", 0, "dagsterApiGrpcArgs"],
            replace("--module-name x"),
            "dagster-user-deployments.deployments.0.dagsterApiGrpcArgs",
        ),
        # closed objects of the chart
        (["concurrency", "pools", "defaultLimit"], rename("defaultLimt"), "defaultLimt"),
        (["concurrency", "pools", "defaultLimit"], replace("one"), "concurrency.pools.defaultLimit"),
        (["runLauncher", "type"], replace("K8sLauncher"), "runLauncher.type"),
        # Kubernetes objects inside the values, checked against the Kubernetes definitions
        (
            ["runLauncher", "config", "k8sRunLauncher", "envSecrets"],
            replace([{"nam": "x"}]),
            "runLauncher.config.k8sRunLauncher",
        ),
        (
            ["dagster-user-deployments", "deployments", 0, "resources"],
            replace({"limit": {"cpu": "1"}}),
            "dagster-user-deployments.deployments.0.resources",
        ),
    ],
)
def test_a_wrong_key_or_value_is_caught(values, path, change, expected):
    problems = values_problems(mutated(values, path, change))
    assert problems and any(expected in p for p in problems), problems


def deployment(values: dict) -> dict:
    [only] = values["dagster-user-deployments"]["deployments"]
    return only


def env_of(values: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in deployment(values)["env"]}


def test_one_user_code_deployment_of_our_definitions(values):
    assert values["dagster-user-deployments"]["enabled"] is True
    dep = deployment(values)
    args = dep["dagsterApiGrpcArgs"]
    assert args[args.index("--module-name") + 1] == "batch_pipeline.definitions"
    assert dep["image"]["repository"].endswith("/batch-pipeline")
    assert dep["includeConfigInLaunchedRuns"]["enabled"] is True


def test_runs_on_kubernetes_with_postgres_and_the_daemon(values):
    assert values["runLauncher"]["type"] == "K8sRunLauncher"
    assert "k8sRunLauncher" in values["runLauncher"]["config"]
    assert isinstance(values["postgresql"]["enabled"], bool)
    assert "postgresqlPassword" not in values["postgresql"]  # passed with --set, never committed
    # the driver the image installs (dagster-postgres -> psycopg2), the scheme the Postgres test tier runs with
    assert values["postgresql"]["postgresqlScheme"] == "postgresql+psycopg2"
    assert values["dagsterDaemon"]["enabled"] is True
    assert values["dagsterDaemon"]["runCoordinator"]["type"] == "QueuedRunCoordinator"
    assert values["concurrency"]["enabled"] is True
    assert values["concurrency"]["runs"]["maxConcurrentRuns"] >= 1
    assert values["concurrency"]["pools"]["defaultLimit"] >= 1  # the gpu pool


def test_secrets_store_and_gpu_settings_agree_with_the_rest(values):
    names = {s["name"] for s in deployment(values)["envSecrets"]}
    launcher = {s["name"] for s in values["runLauncher"]["config"]["k8sRunLauncher"]["envSecrets"]}
    example = {d["metadata"]["name"] for d in load_docs(K8S_DIR / "secrets.example.yaml")}
    assert names == launcher == example == set(DEFAULT_ENV_SECRETS)
    env = env_of(values)
    assert env["BATCH_PIPELINE_HOME"].startswith("s3://")
    assert env["BATCH_PIPELINE_EXECUTOR"] == "k8s"
    assert env["BATCH_PIPELINE_K8S_ENV_SECRETS"].split(",") == list(DEFAULT_ENV_SECRETS)
    server = by_kind(load_docs(K8S_DIR / "vllm-server.yaml"), "Deployment")
    assert (
        parse_node_selector(env["BATCH_PIPELINE_GPU_NODE_SELECTOR"])
        == server["spec"]["template"]["spec"]["nodeSelector"]
    )


# -- the instance config the chart renders from these values, checked by dagster 1.13 itself ---------
def rendered_instance(values: dict) -> dict:
    """The run_coordinator and concurrency sections of the chart's dagster.yaml for our values (the logic
    of templates/helpers/instance/_run-coordinator.tpl and _concurrency.tpl, including their `fail`s)."""
    out: dict = {}
    daemon = values.get("dagsterDaemon", {})
    coordinator = daemon.get("runCoordinator", {})
    qrc = coordinator.get("config", {}).get("queuedRunCoordinator", {}) or {}
    if daemon.get("enabled") and coordinator.get("enabled") and coordinator.get("type") == "QueuedRunCoordinator":
        names = {
            "maxConcurrentRuns": "max_concurrent_runs",
            "tagConcurrencyLimits": "tag_concurrency_limits",
            "dequeueIntervalSeconds": "dequeue_interval_seconds",
            "dequeueUseThreads": "dequeue_use_threads",
            "dequeueNumWorkers": "dequeue_num_workers",
        }
        config = {names[k]: v for k, v in qrc.items() if k in names and v is not None}
        out["run_coordinator"] = {
            "module": "dagster.core.run_coordinator",
            "class": "QueuedRunCoordinator",
            **({"config": config} if config else {}),
        }
    concurrency = values.get("concurrency", {})
    if concurrency.get("enabled"):
        pools, runs = concurrency.get("pools", {}), concurrency.get("runs", {})
        if runs.get("maxConcurrentRuns") is not None and qrc.get("maxConcurrentRuns") is not None:
            raise ValueError(
                "chart fails: both concurrency.runs.maxConcurrentRuns and queuedRunCoordinator.maxConcurrentRuns"
            )
        section: dict = {}
        pool_names = {
            "defaultLimit": "default_limit",
            "granularity": "granularity",
            "opGranularityRunBuffer": "op_granularity_run_buffer",
        }
        if any(pools.get(k) is not None for k in pool_names):
            section["pools"] = {v: pools[k] for k, v in pool_names.items() if pools.get(k) is not None}
        if runs.get("maxConcurrentRuns") is not None or runs.get("tagConcurrencyLimits"):
            section["runs"] = {
                k: v
                for k, v in (
                    ("max_concurrent_runs", runs.get("maxConcurrentRuns")),
                    ("tag_concurrency_limits", runs.get("tagConcurrencyLimits")),
                )
                if v is not None and v != []
            }
        out["concurrency"] = section
    if "telemetry" in values:
        out["telemetry"] = {"enabled": values["telemetry"]["enabled"]}
    return out


def load_instance(tmp_path, instance_yaml: dict) -> dg.DagsterInstance:
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(instance_yaml))
    return dg.DagsterInstance.from_config(str(tmp_path))


def test_rendered_instance_config_is_accepted_by_dagster(values, tmp_path):
    with load_instance(tmp_path, rendered_instance(values)) as instance:
        config = instance.get_concurrency_config()
        assert config.pool_config.default_pool_limit == values["concurrency"]["pools"]["defaultLimit"]
        assert config.run_queue_config.max_concurrent_runs == values["concurrency"]["runs"]["maxConcurrentRuns"]


def test_run_limits_in_two_places_are_caught(values, tmp_path):
    both = mutated(
        values,
        ["dagsterDaemon", "runCoordinator"],
        replace(
            {
                "enabled": True,
                "type": "QueuedRunCoordinator",
                "config": {"queuedRunCoordinator": {"maxConcurrentRuns": 4}},
            }
        ),
    )
    assert values_problems(both) == []  # the schema alone does not see it
    with pytest.raises(ValueError, match="both"):
        rendered_instance(both)
    # and with the pools set, dagster itself refuses a run limit in the run coordinator's config
    pools_only = mutated(both, ["concurrency", "runs"], replace({}))
    with pytest.raises(Exception, match="max_concurrent_runs"):
        load_instance(tmp_path, rendered_instance(pools_only))
