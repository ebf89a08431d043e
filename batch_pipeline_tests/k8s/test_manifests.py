"""Every manifest under k8s/ validates against the Kubernetes schemas, and the pieces fit together."""

import copy

import kubernetes_validate
import pytest

from batch_pipeline.core.settings import DEFAULT_ENV_SECRETS
from batch_pipeline.defs.k8s import DEFAULT_GPU_NODE_SELECTOR, MODEL_CACHE_CLAIM
from batch_pipeline_tests.k8s.support import K8S_DIR, by_kind, load_docs, validate_k8s

MANIFESTS = sorted(K8S_DIR.glob("*.yaml"))


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_validates_against_kubernetes_schemas(path):
    docs = load_docs(path)
    assert docs, f"{path.name} holds no object"
    for doc in docs:
        assert validate_k8s(doc) == "1.30", doc["metadata"]["name"]


@pytest.mark.parametrize(
    ("where", "change"),
    [
        (["spec", "template", "spec"], lambda d: d.__setitem__("nodeSelecter", d.pop("nodeSelector"))),
        (["spec"], lambda d: d.__setitem__("replicas", "one")),
        (
            ["spec", "template", "spec", "containers", 0, "readinessProbe", "httpGet"],
            lambda d: d.__setitem__("paht", d.pop("path")),
        ),
    ],
)
def test_validation_catches_a_broken_manifest(where, change):
    deployment = copy.deepcopy(by_kind(load_docs(K8S_DIR / "vllm-server.yaml"), "Deployment"))
    node = deployment
    for key in where:
        node = node[key]
    change(node)
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_k8s(deployment)


def test_an_unknown_kind_is_not_silently_accepted():
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        validate_k8s({"apiVersion": "v1", "kind": "Deploymnet", "metadata": {"name": "x"}})


def test_vllm_server_runs_on_a_gpu_node_with_the_model_cache():
    docs = load_docs(K8S_DIR / "vllm-server.yaml")
    deployment, service = by_kind(docs, "Deployment"), by_kind(docs, "Service")
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod["nodeSelector"] == DEFAULT_GPU_NODE_SELECTOR
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    args = container["args"]
    assert "--enable-prefix-caching" in args
    assert args[args.index("--model") + 1].startswith("/models/")
    claim = {v["name"]: v for v in pod["volumes"]}["model-cache"]["persistentVolumeClaim"]["claimName"]
    assert {"name": "model-cache", "mountPath": "/models", "readOnly": True} in container["volumeMounts"]
    pvc = by_kind(load_docs(K8S_DIR / "model-cache-pvc.yaml"), "PersistentVolumeClaim")
    assert claim == pvc["metadata"]["name"] == MODEL_CACHE_CLAIM
    assert "ReadWriteMany" in pvc["spec"]["accessModes"]
    # the Service reaches the pods, on the container's port
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    port_names = {p["name"]: p["containerPort"] for p in container["ports"]}
    [port] = service["spec"]["ports"]
    assert port["targetPort"] in port_names and port["port"] == port_names[port["targetPort"]] == 8000


def test_example_secrets_hold_placeholders_only():
    secrets = {d["metadata"]["name"]: d for d in load_docs(K8S_DIR / "secrets.example.yaml")}
    assert set(secrets) == set(DEFAULT_ENV_SECRETS)
    assert {"OPENAI_API_KEY", "ANTHROPIC_API_KEY"} <= set(secrets["batch-pipeline-provider-keys"]["stringData"])
    for secret in secrets.values():
        assert "data" not in secret  # base64 values would hide what is in them
        for key, value in secret["stringData"].items():
            assert value == "REPLACE-ME", f"{secret['metadata']['name']}.{key} is not a placeholder"
