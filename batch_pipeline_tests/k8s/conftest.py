"""Every Kubernetes test starts from the defaults of batch_pipeline/defs/k8s.py, whatever the shell has set."""

import pytest

K8S_ENV = (
    "BATCH_PIPELINE_EXECUTOR",
    "BATCH_PIPELINE_K8S_NAMESPACE",
    "BATCH_PIPELINE_K8S_ENV_SECRETS",
    "BATCH_PIPELINE_K8S_ENV_VARS",
    "BATCH_PIPELINE_STEP_CPU",
    "BATCH_PIPELINE_STEP_MEMORY",
    "BATCH_PIPELINE_STEP_MEMORY_LIMIT",
    "BATCH_PIPELINE_STEP_GRACE_S",
    "BATCH_PIPELINE_GPU_IMAGE",
    "BATCH_PIPELINE_GPU_NODE_SELECTOR",
    "BATCH_PIPELINE_GPU_TOLERATION_KEY",
    "BATCH_PIPELINE_GPU_CPU",
    "BATCH_PIPELINE_GPU_MEMORY",
    "BATCH_PIPELINE_GPU_SHM",
)


@pytest.fixture(autouse=True)
def k8s_defaults(monkeypatch):
    for name in K8S_ENV:
        monkeypatch.delenv(name, raising=False)
