"""The Kubernetes Job a vLLM shard step would get: rendered by dagster-k8s from our tags, no cluster."""

import json

import pytest
from dagster_k8s.job import get_user_defined_k8s_config

from batch_pipeline.defs.k8s import (
    GPU_POOL,
    K8S_CONFIG_TAG,
    MODEL_CACHE_CLAIM,
    gpu_step_tags,
    is_gpu_backend,
    k8s_executor,
    parse_node_selector,
)
from batch_pipeline_tests.k8s.support import from_env, gpu_problems, render_step_job, shard_job, validate_k8s

STORE = "s3://batch-pipeline-test/prefix"


@pytest.fixture(autouse=True)
def s3_store(monkeypatch):
    """Step pods copy BATCH_PIPELINE_HOME from the run pod: an S3 store, as on a cluster."""
    monkeypatch.setenv("BATCH_PIPELINE_HOME", STORE)


def gpu_job(**kwargs) -> dict:
    tags, pool, executor_config = shard_job(gpu_step_tags(from_env(), **kwargs), GPU_POOL, k8s_executor(from_env()))
    assert pool == GPU_POOL
    return render_step_job(tags, executor_config)


def test_gpu_step_job_has_gpu_node_selector_tolerations_and_model_cache():
    job = gpu_job()
    assert gpu_problems(job) == []
    pod = job["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert container["resources"]["requests"] == {"cpu": "8", "memory": "32Gi"}
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["model-cache"]["persistentVolumeClaim"] == {"claimName": MODEL_CACHE_CLAIM, "readOnly": True}
    assert {"name": "model-cache", "mountPath": "/models", "readOnly": True} in container["volumeMounts"]
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    # what the executor config adds to every step: secrets, the store, the grace period, the namespace
    assert {"secretRef": {"name": "batch-pipeline-provider-keys"}} in container["envFrom"]
    assert {"name": "BATCH_PIPELINE_HOME", "value": STORE} in container["env"]
    assert pod["terminationGracePeriodSeconds"] == 120
    assert job["metadata"]["namespace"] == "batch-pipeline"
    # and Kubernetes would accept the object (strict schema: unknown fields are errors)
    assert validate_k8s(job) == "1.30"


def test_a_step_without_gpu_tags_fails_the_gpu_check():
    tags, pool, executor_config = shard_job(None, None, k8s_executor(from_env()))
    job = render_step_job(tags, executor_config)
    assert pool is None
    assert gpu_problems(job) == [
        "no nvidia.com/gpu limit of 1",
        "no node selector",
        "no toleration for the nvidia.com/gpu taint",
        "no volume of the PVC batch-pipeline-model-cache",
    ]
    # the executor's defaults still apply: CPU/memory requests, no GPU
    [container] = job["spec"]["template"]["spec"]["containers"]
    assert container["resources"] == {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "4Gi"}}


def test_gpu_count_node_selector_claim_and_image_follow_arguments_and_environment(monkeypatch):
    monkeypatch.setenv("BATCH_PIPELINE_GPU_IMAGE", "registry.invalid/batch-pipeline-gpu:1")
    monkeypatch.setenv("BATCH_PIPELINE_GPU_NODE_SELECTOR", "cloud.google.com/gke-accelerator=nvidia-l4, pool=gpu")
    job = gpu_job(gpus=2, model_cache_claim="other-cache")
    assert gpu_problems(job, gpus=2, claim="other-cache") == []
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-l4", "pool": "gpu"}
    assert pod["containers"][0]["image"] == "registry.invalid/batch-pipeline-gpu:1"
    job = gpu_job(node_selector={"accelerator": "a100"})
    assert job["spec"]["template"]["spec"]["nodeSelector"] == {"accelerator": "a100"}
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.invalid/batch-pipeline-gpu:1"


def test_node_selector_parsing():
    assert parse_node_selector('{"a": "b"}') == {"a": "b"}
    assert parse_node_selector("a=b,c=d") == {"a": "b", "c": "d"}
    assert parse_node_selector("") == {}
    with pytest.raises(ValueError):
        parse_node_selector("a")
    with pytest.raises(ValueError):
        parse_node_selector("[1]")


def test_tags_are_what_the_k8s_executor_parses():
    tags = gpu_step_tags(from_env())
    assert set(tags) == {K8S_CONFIG_TAG}
    parsed = get_user_defined_k8s_config({K8S_CONFIG_TAG: json.dumps(tags[K8S_CONFIG_TAG])})
    assert parsed.container_config["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert parsed.pod_spec_config["tolerations"][0]["key"] == "nvidia.com/gpu"
    with pytest.raises(ValueError):
        gpu_step_tags(from_env(), gpus=0)


def test_a_misspelled_field_in_the_tag_is_rejected_like_the_executor_would():
    config = gpu_step_tags(from_env())[K8S_CONFIG_TAG]
    config["pod_spec_config"]["node_selektor"] = config["pod_spec_config"].pop("node_selector")
    with pytest.raises(Exception, match="node_selektor"):
        get_user_defined_k8s_config({K8S_CONFIG_TAG: json.dumps(config)})


@pytest.mark.parametrize(
    ("name", "gpu"),
    [
        ("vllm_offline", True),
        ("vllm", True),
        ("vllm_cpu", True),
        ("openai_batch", False),
        ("anthropic_batch", False),
        ("online", False),
        ("my_vllm", False),
    ],
)
def test_is_gpu_backend(name, gpu):
    assert is_gpu_backend(name) is gpu
