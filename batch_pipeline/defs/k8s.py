"""Kubernetes: the step executor, and the ``dagster-k8s/config`` tags that put vLLM shard steps on GPU nodes.

On Kubernetes every step runs in its own pod (``k8s_job_executor``), so the store must be object storage
(``BATCH_PIPELINE_HOME=s3://...``). Nothing here names a cluster: every value is a field of ``K8sSettings``
(``core/settings.py``), read from the environment of the code server (set by ``k8s/helm/values.yaml``):

- ``BATCH_PIPELINE_EXECUTOR`` (unset): ``k8s`` makes ``location_executor()`` return ``k8s_executor()``
- ``BATCH_PIPELINE_K8S_NAMESPACE`` (``batch-pipeline``): namespace of the step Jobs
- ``BATCH_PIPELINE_K8S_ENV_SECRETS`` (``batch-pipeline-provider-keys,batch-pipeline-storage``): Secrets
  loaded into every step pod (``envFrom``)
- ``BATCH_PIPELINE_K8S_ENV_VARS`` (empty): more variables copied from the run pod, comma-separated;
  ``BATCH_PIPELINE_HOME`` always is (a step fails to launch without it)
- ``BATCH_PIPELINE_STEP_CPU`` / ``_MEMORY`` / ``_MEMORY_LIMIT`` (``500m`` / ``1Gi`` / ``4Gi``): every step pod
- ``BATCH_PIPELINE_STEP_GRACE_S`` (``120``): ``terminationGracePeriodSeconds``, time for a step to flush
  and release its lease on SIGTERM
- ``BATCH_PIPELINE_GPU_IMAGE`` (unset: the code location's image): image of GPU steps (``k8s/Dockerfile.gpu``)
- ``BATCH_PIPELINE_GPU_NODE_SELECTOR`` (``{"nvidia.com/gpu.present": "true"}``): JSON object or ``k=v,k2=v2``
- ``BATCH_PIPELINE_GPU_TOLERATION_KEY`` (``nvidia.com/gpu``): taint tolerated by GPU steps (Exists, NoSchedule)
- ``BATCH_PIPELINE_GPU_CPU`` / ``_MEMORY`` (``8`` / ``32Gi``): GPU step requests (the memory is also the limit)
- ``BATCH_PIPELINE_GPU_SHM`` (``8Gi``): size of the in-memory ``/dev/shm`` of GPU steps

Manifest steps (``defs/manifest_parts.py``, the default graph on this executor) get their own requests from the
constants below: a per-file step ``MANIFEST_FILE_CPU`` / ``_MEMORY`` / ``_MEMORY_LIMIT``; the merge 2 CPUs and,
as request and limit, the spec's ``shards.manifest_memory_mb`` plus a third (its dedup spills at half of it).

GPU steps also share the concurrency pool ``GPU_POOL``; its limit lives in the Dagster instance
(``concurrency.pools`` in the Helm values, or ``dagster instance concurrency set gpu N``).
"""

import json
from collections.abc import Mapping

from dagster import ExecutorDefinition, in_process_executor

from batch_pipeline.core.settings import K8sSettings

GPU_POOL = "gpu"
K8S_CONFIG_TAG = "dagster-k8s/config"
MODEL_CACHE_CLAIM = "batch-pipeline-model-cache"
MODEL_CACHE_MOUNT = "/models"
MODEL_CACHE_VOLUME = "model-cache"
SHM_VOLUME = "dshm"
GPU_RESOURCE = "nvidia.com/gpu"

PASSTHROUGH_ENV_VARS = ("BATCH_PIPELINE_HOME",)
# a per-file manifest step: one file read, parsed, rendered and hashed block by block (a reader thread ahead of it)
MANIFEST_FILE_CPU, MANIFEST_FILE_MEMORY, MANIFEST_FILE_MEMORY_LIMIT = "1", "1Gi", "2Gi"
MANIFEST_MERGE_CPU = "2"  # the merge deals on one thread while two write shard files (zstd releases the GIL)
DEFAULT_GPU_NODE_SELECTOR = {"nvidia.com/gpu.present": "true"}


def _csv(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def parse_node_selector(text: str) -> dict[str, str]:
    """``{"k": "v"}`` (JSON) or ``k=v,k2=v2``; an empty string is an empty selector."""
    text = text.strip()
    if not text:
        return {}
    if text.startswith("{"):
        parsed = json.loads(text)
        if not isinstance(parsed, dict):
            raise ValueError(f"node selector must be a JSON object, got {text!r}")
        return {str(k): str(v) for k, v in parsed.items()}
    out = {}
    for pair in _csv(text):
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"node selector entry {pair!r} is not key=value")
        out[key.strip()] = value.strip()
    return out


def gpu_node_selector(k8s: K8sSettings) -> dict[str, str]:
    raw = k8s.gpu_node_selector
    return dict(DEFAULT_GPU_NODE_SELECTOR) if raw is None else parse_node_selector(raw)


def k8s_executor_config(k8s: K8sSettings) -> dict:
    """The ``k8s_job_executor`` config for every step: namespace, secrets, env, default resources."""
    env_vars = list(PASSTHROUGH_ENV_VARS)
    env_vars += [v for v in k8s.env_vars if v not in env_vars]
    return {
        "job_namespace": k8s.namespace,
        "env_secrets": list(k8s.env_secrets),
        # a name without "=value" is copied from the run pod's environment when the step is launched
        "env_vars": env_vars,
        "resources": {
            "requests": {
                "cpu": k8s.step_cpu,
                "memory": k8s.step_memory,
            },
            "limits": {"memory": k8s.step_memory_limit},
        },
        "step_k8s_config": {
            "pod_spec_config": {
                "termination_grace_period_seconds": k8s.step_grace_s,
            },
        },
    }


def k8s_executor(k8s: K8sSettings) -> ExecutorDefinition:
    """``k8s_job_executor`` configured by the settings: each step is a Kubernetes Job."""
    from dagster_k8s import k8s_job_executor  # here, not at import: the Kubernetes client costs ~0.7 s to load

    return k8s_job_executor.configured(k8s_executor_config(k8s), name="batch_pipeline_k8s")


def location_executor(k8s: K8sSettings) -> ExecutorDefinition | None:
    """``BATCH_PIPELINE_EXECUTOR``: ``k8s`` (set by the Helm values) -> one pod per step; ``in_process`` -> the
    whole run in its worker (fast local runs, sensors on a laptop); unset -> Dagster's default."""
    if k8s.executor == "k8s":
        return k8s_executor(k8s)
    if k8s.executor == "in_process":
        return in_process_executor
    return None


def is_gpu_backend(name: str) -> bool:
    """Backends whose shard steps hold a GPU: the self-hosted vLLM ones."""
    return name.startswith("vllm")


def gpu_step_tags(
    k8s: K8sSettings,
    gpus: int = 1,
    node_selector: Mapping[str, str] | None = None,
    model_cache_claim: str = MODEL_CACHE_CLAIM,
) -> dict:
    """``op_tags`` for a shard step that runs vLLM in its own pod on a GPU node.

    The pod gets ``gpus`` × ``nvidia.com/gpu``, CPU/memory requests, the GPU node selector and a
    toleration for the GPU taint, the model cache PVC at ``/models`` (read-only) and an in-memory
    ``/dev/shm``. Use with ``pool=GPU_POOL`` so the instance caps how many run at once.
    """
    if gpus < 1:
        raise ValueError(f"gpus must be >= 1, got {gpus}")
    memory = k8s.gpu_memory
    container: dict = {
        "resources": {
            "limits": {GPU_RESOURCE: str(gpus), "memory": memory},
            "requests": {"cpu": k8s.gpu_cpu, "memory": memory},
        },
        "volume_mounts": [
            {"name": MODEL_CACHE_VOLUME, "mount_path": MODEL_CACHE_MOUNT, "read_only": True},
            {"name": SHM_VOLUME, "mount_path": "/dev/shm"},
        ],
    }
    if k8s.gpu_image:
        container["image"] = k8s.gpu_image
    config = {
        "container_config": container,
        "pod_spec_config": {
            "node_selector": dict(node_selector) if node_selector is not None else gpu_node_selector(k8s),
            "tolerations": [
                {
                    "key": k8s.gpu_toleration_key,
                    "operator": "Exists",
                    "effect": "NoSchedule",
                }
            ],
            "volumes": [
                {
                    "name": MODEL_CACHE_VOLUME,
                    "persistent_volume_claim": {"claim_name": model_cache_claim, "read_only": True},
                },
                {
                    "name": SHM_VOLUME,
                    "empty_dir": {"medium": "Memory", "size_limit": k8s.gpu_shm},
                },
            ],
        },
    }
    return {K8S_CONFIG_TAG: config}


def _container_resources(cpu: str, memory: str, memory_limit: str) -> dict:
    return {
        K8S_CONFIG_TAG: {
            "container_config": {
                "resources": {
                    "requests": {"cpu": cpu, "memory": memory},
                    "limits": {"memory": memory_limit},
                }
            }
        }
    }


def manifest_file_step_tags() -> dict:
    """``op_tags`` of a per-file manifest step: CPU/memory for one file's preparation; no GPU, no node selector."""
    return _container_resources(MANIFEST_FILE_CPU, MANIFEST_FILE_MEMORY, MANIFEST_FILE_MEMORY_LIMIT)


def manifest_merge_step_tags(manifest_memory_mb: int) -> dict:
    """``op_tags`` of the manifest merge: ``manifest_memory_mb`` (the build's bound, ``shards.manifest_memory_mb``)
    plus a third for the interpreter and Arrow's buffers, as request and limit (3072 MB -> 4096Mi)."""
    memory = f"{-(-manifest_memory_mb * 4 // 3)}Mi"
    return _container_resources(MANIFEST_MERGE_CPU, memory, memory)
