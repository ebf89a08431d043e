"""The Kubernetes Jobs of the manifest's per-file steps and merge, beside a vLLM shard step's: the default graph
of a code location on the k8s executor, rendered by dagster-k8s from the real job's plan, no cluster."""

import pytest

from batch_pipeline.core.settings import K8sSettings, Settings
from batch_pipeline.defs.build import build_definitions
from batch_pipeline.defs.k8s import GPU_POOL, MANIFEST_FILE_CPU, MANIFEST_FILE_MEMORY, MANIFEST_FILE_MEMORY_LIMIT
from batch_pipeline.defs.manifest_parts import uses_file_steps
from batch_pipeline_tests.core.helpers import base_spec_dict, write_spec
from batch_pipeline_tests.k8s.support import from_env, gpu_problems, job_step, render_step_job, validate_k8s

STORE = "s3://batch-pipeline-test/prefix"
FILE_STEP, MERGE_STEP = "t__manifest.t__manifest_file[?]", "t__manifest.t__manifest_merge"
NO_GPU = [
    "no nvidia.com/gpu limit of 1",
    "no node selector",
    "no toleration for the nvidia.com/gpu taint",
    "no volume of the PVC batch-pipeline-model-cache",
]


@pytest.fixture(autouse=True)
def s3_store(monkeypatch):
    monkeypatch.setenv("BATCH_PIPELINE_HOME", STORE)


def location(tmp_path, executor: str | None = "k8s", **spec_overrides):
    """The code location of one job (input: a folder of files) with the settings a cluster's code server has."""
    spec = write_spec(tmp_path / "jobs", base_spec_dict(str(tmp_path / "in" / "*.jsonl"), **spec_overrides))
    settings = Settings(home=STORE, k8s=K8sSettings(**{**from_env().model_dump(), "executor": executor}))
    return build_definitions([spec], settings=settings)


def rendered(defs, job: str, step_key: str) -> tuple[dict, str | None]:
    tags, pool, executor_config = job_step(defs.resolve_job_def(job), step_key)
    return render_step_job(tags, executor_config, op=step_key.split(".")[-1].split("[")[0]), pool


def pod_and_container(job: dict) -> tuple[dict, dict]:
    pod = job["spec"]["template"]["spec"]
    [container] = pod["containers"]
    return pod, container


def manifest_node(job):
    [node] = [n for n in job.graph.nodes if n.name == "t__manifest"]
    return node.definition


def test_prepare_on_k8s_runs_one_manifest_step_per_file_then_the_merge(tmp_path):
    graph = manifest_node(location(tmp_path).resolve_job_def("t_prepare"))
    assert sorted(n.name for n in graph.nodes) == ["t__manifest_file", "t__manifest_files", "t__manifest_merge"]
    tags, _, _ = job_step(location(tmp_path).resolve_job_def("t_prepare"), FILE_STEP)  # mapped: one per file
    assert "dagster-k8s/config" in tags


def test_manifest_file_step_job_has_its_requests_the_store_and_no_gpu(tmp_path):
    job, pool = rendered(location(tmp_path), "t_prepare", FILE_STEP)
    pod, container = pod_and_container(job)
    assert pool is None
    assert container["resources"] == {
        "requests": {"cpu": MANIFEST_FILE_CPU, "memory": MANIFEST_FILE_MEMORY},
        "limits": {"memory": MANIFEST_FILE_MEMORY_LIMIT},
    }
    assert (MANIFEST_FILE_CPU, MANIFEST_FILE_MEMORY, MANIFEST_FILE_MEMORY_LIMIT) == ("1", "1Gi", "2Gi")
    # the executor's share, as for every step: secrets, the store copied from the run pod, grace, namespace
    assert {"secretRef": {"name": "batch-pipeline-provider-keys"}} in container["envFrom"]
    assert {"secretRef": {"name": "batch-pipeline-storage"}} in container["envFrom"]
    assert {"name": "BATCH_PIPELINE_HOME", "value": STORE} in container["env"]
    assert pod["terminationGracePeriodSeconds"] == 120
    assert job["metadata"]["namespace"] == "batch-pipeline"
    # no GPU: no GPU limit, node selector, toleration or model cache; no shared memory volume
    assert gpu_problems(job) == NO_GPU
    assert not pod.get("volumes") and not container.get("volumeMounts")
    assert job["spec"]["template"]["metadata"]["labels"]["dagster/op"] == "t__manifest_file"
    assert validate_k8s(job) == "1.30"


def test_manifest_merge_step_job_holds_the_builds_memory_bound(tmp_path):
    job, _ = rendered(location(tmp_path), "t_prepare", MERGE_STEP)
    _, container = pod_and_container(job)
    # shards.manifest_memory_mb 3072 (the default) and a third: request and limit, so it is never evicted first
    assert container["resources"] == {"requests": {"cpu": "2", "memory": "4096Mi"}, "limits": {"memory": "4096Mi"}}
    assert gpu_problems(job) == NO_GPU
    assert validate_k8s(job) == "1.30"
    bigger = location(tmp_path / "big", shards={"manifest_memory_mb": 6144})
    job, _ = rendered(bigger, "t_prepare", MERGE_STEP)
    assert pod_and_container(job)[1]["resources"]["limits"] == {"memory": "8192Mi"}


def test_beside_the_vllm_shard_step_of_the_same_location(tmp_path):
    """A vLLM job on the same location: its manifest steps are CPU pods, its shard steps GPU pods."""
    defs = location(tmp_path, backend={"name": "vllm", "settings": {"model_path": "/m"}})
    manifest_job, _ = rendered(defs, "t_prepare", FILE_STEP)
    assert gpu_problems(manifest_job) == NO_GPU
    shard_job_, pool = rendered(defs, "t_shards", "t__submissions")
    assert pool == GPU_POOL and gpu_problems(shard_job_) == []
    _, container = pod_and_container(shard_job_)
    assert container["resources"]["requests"] == {"cpu": "8", "memory": "32Gi"}
    assert validate_k8s(shard_job_) == "1.30"


@pytest.mark.parametrize("executor", [None, "in_process"])
def test_off_kubernetes_the_manifest_is_one_step(tmp_path, executor):
    assert not hasattr(manifest_node(location(tmp_path, executor).resolve_job_def("t_prepare")), "nodes")  # an op


def test_a_later_pass_reading_another_jobs_table_keeps_one_manifest_step(tmp_path):
    settings = Settings(home=STORE, k8s=K8sSettings(executor="k8s"))
    files = write_spec(tmp_path / "a", base_spec_dict(str(tmp_path / "in" / "*.jsonl")))
    spec = base_spec_dict("unused", name="second")
    spec["input"] = {"from_job": "t", "text_field": "body", "key_field": "id"}
    assert uses_file_steps(files, settings) and not uses_file_steps(write_spec(tmp_path / "b", spec), settings)
