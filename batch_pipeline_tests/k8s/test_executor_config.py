"""The configured k8s_job_executor: its config resolves in a Dagster job, without a cluster."""

import dagster as dg
import pytest
from dagster._core.errors import DagsterInvalidConfigError
from dagster_k8s import k8s_job_executor
from dagster_k8s.container_context import K8sContainerContext

from batch_pipeline.defs.k8s import k8s_executor, k8s_executor_config, location_executor
from batch_pipeline_tests.k8s.support import from_env, shard_job


def test_configured_executor_resolves_in_a_job():
    _, _, resolved = shard_job(None, None, k8s_executor(from_env()))
    assert resolved["job_namespace"] == "batch-pipeline"
    assert resolved["env_secrets"] == ["batch-pipeline-provider-keys", "batch-pipeline-storage"]
    assert resolved["env_vars"] == ["BATCH_PIPELINE_HOME"]
    assert resolved["resources"] == {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "4Gi"}}
    assert resolved["step_k8s_config"]["pod_spec_config"] == {"termination_grace_period_seconds": 120}
    assert resolved["retries"] == {"enabled": {}}  # the executor's own defaults were filled in


def test_environment_drives_the_config(monkeypatch):
    monkeypatch.setenv("BATCH_PIPELINE_K8S_NAMESPACE", "team-a")
    monkeypatch.setenv("BATCH_PIPELINE_K8S_ENV_SECRETS", "keys-a")
    monkeypatch.setenv("BATCH_PIPELINE_K8S_ENV_VARS", "BATCH_PIPELINE_JOBS, BATCH_PIPELINE_HOME")
    monkeypatch.setenv("BATCH_PIPELINE_STEP_GRACE_S", "300")
    _, _, resolved = shard_job(None, None, k8s_executor(from_env()))
    assert resolved["job_namespace"] == "team-a"
    assert resolved["env_secrets"] == ["keys-a"]
    assert resolved["env_vars"] == ["BATCH_PIPELINE_HOME", "BATCH_PIPELINE_JOBS"]
    assert resolved["step_k8s_config"]["pod_spec_config"]["termination_grace_period_seconds"] == 300


def test_a_misspelled_key_is_rejected():
    bad = {**k8s_executor_config(from_env()), "job_namspace": "x"}
    with pytest.raises(DagsterInvalidConfigError, match="job_namspace"):
        shard_job(None, None, k8s_job_executor.configured(bad, name="bad_k8s"))


def test_the_store_must_be_passed_through(monkeypatch):
    """A step pod without BATCH_PIPELINE_HOME would write to its own disk: launching it fails instead."""
    _, _, resolved = shard_job(None, None, k8s_executor(from_env()))
    monkeypatch.delenv("BATCH_PIPELINE_HOME", raising=False)
    with pytest.raises(Exception, match="BATCH_PIPELINE_HOME"):
        K8sContainerContext(env_vars=resolved["env_vars"])
    monkeypatch.setenv("BATCH_PIPELINE_HOME", "s3://bucket/prefix")
    context = K8sContainerContext(env_vars=resolved["env_vars"])
    env = context.run_k8s_config.container_config["env"]
    assert {"name": "BATCH_PIPELINE_HOME", "value": "s3://bucket/prefix"} in env


def test_the_executor_follows_the_environment(monkeypatch):
    assert location_executor(from_env()) is None
    monkeypatch.setenv("BATCH_PIPELINE_EXECUTOR", "k8s")
    executor = location_executor(from_env())
    assert isinstance(executor, dg.ExecutorDefinition)
    assert executor.name == "batch_pipeline_k8s"
