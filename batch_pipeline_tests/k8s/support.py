"""Shared helpers of the Kubernetes tests: manifests, the chart's values schema, and step Jobs rendered
the way ``dagster_k8s``'s step handler renders them. Nothing here needs a cluster."""

import copy
import json
from pathlib import Path
from typing import Any

import dagster as dg
import jsonschema
import kubernetes
import kubernetes_validate
import yaml
from dagster._core.execution.api import create_execution_plan
from dagster._core.system_config.objects import ResolvedRunConfig
from dagster_k8s.container_context import K8sContainerContext
from dagster_k8s.job import (
    DagsterK8sJobConfig,
    UserDefinedDagsterK8sConfig,
    construct_dagster_k8s_job,
    get_user_defined_k8s_config,
)
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from batch_pipeline.core.settings import K8sSettings, Settings

REPO = Path(__file__).resolve().parents[2]
K8S_DIR = REPO / "k8s"
HELM_VALUES = K8S_DIR / "helm" / "values.yaml"
CHART_SCHEMA = Path(__file__).parent / "fixtures" / "dagster-chart-values.schema.json"
K8S_VERSION = "1.30"  # a version kubernetes-validate ships; the chart needs >= 1.18
DUMMY_IMAGE = "registry.invalid/batch-pipeline:test"


# -- manifests ---------------------------------------------------------------------------------------
def load_docs(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def validate_k8s(doc: dict) -> str:
    """Strict schema validation (unknown fields are errors); a kind without a schema is an error too."""
    return kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def by_kind(docs: list[dict], kind: str) -> dict:
    [doc] = [d for d in docs if d["kind"] == kind]
    return doc


# -- the step Job of a shard asset -------------------------------------------------------------------
def shard_job(
    op_tags: dict | None, pool: str | None, executor_def: dg.ExecutorDefinition
) -> tuple[dict[str, str], str | None, dict]:
    """A one-asset job with ``executor_def``: (step tags, step pool, resolved executor config)."""

    @dg.asset(name="shard_results", op_tags=op_tags, pool=pool)
    def shard_results() -> None:
        return None

    job = dg.define_asset_job("vllm_shards", selection=[shard_results], executor_def=executor_def)
    job_def = dg.Definitions(assets=[shard_results], jobs=[job]).resolve_job_def("vllm_shards")
    executor_config = ResolvedRunConfig.build(job_def, {}).execution.execution_engine_config
    step = create_execution_plan(job_def).get_step_by_key("shard_results")
    return dict(step.tags), step.pool, executor_config


def job_step(job_def: dg.JobDefinition, step_key: str) -> tuple[dict[str, str], str | None, dict]:
    """One step of a real job (a mapped step's key ends ``[?]``): (its tags, its pool, the resolved executor
    config), as ``shard_job`` gives for a stand-in."""
    executor_config = ResolvedRunConfig.build(job_def, {}).execution.execution_engine_config
    step = create_execution_plan(job_def).get_step_by_key(step_key)
    return dict(step.tags), step.pool, executor_config


def render_step_job(step_tags: dict[str, str], executor_config: dict, op: str = "shard_results") -> dict:
    """The Kubernetes Job of one step, as ``K8sStepHandler.launch_step`` builds it (less the parts that
    come from a live run launcher): executor config, merged with the step's ``dagster-k8s/config`` tag
    parsed by ``get_user_defined_k8s_config``, through ``construct_dagster_k8s_job``."""
    executor_context = K8sContainerContext(
        env_config_maps=executor_config.get("env_config_maps"),
        env_secrets=executor_config.get("env_secrets"),
        env_vars=executor_config.get("env_vars"),
        volume_mounts=executor_config.get("volume_mounts"),
        volumes=executor_config.get("volumes"),
        labels=executor_config.get("labels"),
        namespace=executor_config.get("job_namespace"),
        resources=executor_config.get("resources"),
        run_k8s_config=UserDefinedDagsterK8sConfig.from_dict(executor_config.get("step_k8s_config", {})),
    )
    context = executor_context.merge(K8sContainerContext(run_k8s_config=get_user_defined_k8s_config(step_tags)))
    job_config = DagsterK8sJobConfig(
        job_image=DUMMY_IMAGE,
        dagster_home="/opt/dagster/dagster_home",
        instance_config_map="dagster-instance",
        postgres_password_secret="dagster-postgresql-secret",
    )
    job = construct_dagster_k8s_job(
        job_config,
        args=["dagster", "api", "execute_step"],
        job_name="dagster-step-0123456789abcdef",
        component="step_worker",
        user_defined_k8s_config=context.run_k8s_config,
        labels={"dagster/op": op},
    )
    rendered = kubernetes.client.ApiClient().sanitize_for_serialization(job)
    rendered["metadata"]["namespace"] = context.namespace
    return rendered


def gpu_problems(job: dict, *, gpus: int = 1, claim: str = "batch-pipeline-model-cache") -> list[str]:
    """What a GPU shard step's Job lacks: GPU limit, GPU node selector, toleration, model cache volume+mount."""
    pod = job["spec"]["template"]["spec"]
    [container] = pod["containers"]
    problems = []
    if str(container.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")) != str(gpus):
        problems.append(f"no nvidia.com/gpu limit of {gpus}")
    if not pod.get("nodeSelector"):
        problems.append("no node selector")
    if not any(
        t.get("key") == "nvidia.com/gpu" and t.get("operator") == "Exists" and t.get("effect") == "NoSchedule"
        for t in pod.get("tolerations") or []
    ):
        problems.append("no toleration for the nvidia.com/gpu taint")
    volumes = {v["name"]: v for v in pod.get("volumes") or []}
    cache = [name for name, v in volumes.items() if v.get("persistentVolumeClaim", {}).get("claimName") == claim]
    if not cache:
        problems.append(f"no volume of the PVC {claim}")
    elif not any(m["name"] == cache[0] and m["mountPath"] == "/models" for m in container.get("volumeMounts") or []):
        problems.append("model cache not mounted at /models")
    return problems


# -- the Helm chart's values schema ------------------------------------------------------------------
def chart_schema() -> dict:
    schema = json.loads(CHART_SCHEMA.read_text())
    schema.pop("$comment", None)
    return schema


def _external_refs(node: Any, out: set[str]) -> set[str]:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and not ref.startswith("#"):
            out.add(ref.split("#", 1)[0])
        for value in node.values():
            _external_refs(value, out)
    elif isinstance(node, list):
        for value in node:
            _external_refs(value, out)
    return out


def _without_required(node: Any) -> Any:
    """Our file holds overrides, merged by Helm onto the chart's defaults: required keys are the chart's."""
    if isinstance(node, dict):
        return {k: _without_required(v) for k, v in node.items() if k != "required"}
    if isinstance(node, list):
        return [_without_required(v) for v in node]
    return node


def values_validator(schema: dict) -> jsonschema.Draft202012Validator:
    """A validator of Helm values against the chart schema, offline: its Kubernetes references point to
    kubernetes-json-schema's ``_definitions.json``; they resolve to the strict definitions that
    kubernetes-validate ships (``#/definitions/X`` there is ``#/$defs/X`` here)."""
    defs_path = (
        Path(kubernetes_validate.__file__).parent
        / "kubernetes-json-schema"
        / f"v{K8S_VERSION}.0-local-strict"
        / "_definitions.json"
    )
    k8s_defs = json.loads(defs_path.read_text())["$defs"]
    k8s_doc = Resource.from_contents({"$defs": k8s_defs, "definitions": k8s_defs}, default_specification=DRAFT202012)
    uris = _external_refs(schema, set())
    assert uris and all(uri.endswith("/_definitions.json") for uri in uris), uris
    registry = Registry().with_resources([(uri, k8s_doc) for uri in uris])
    return jsonschema.Draft202012Validator(_without_required(schema), registry=registry)


def _resolve(node: dict, schema: dict) -> dict:
    while isinstance(node.get("$ref"), str) and node["$ref"].startswith("#/$defs/"):
        node = {**schema["$defs"][node["$ref"].split("/")[-1]], **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _branches(node: dict, schema: dict) -> list[dict]:
    node = _resolve(node, schema)
    return [_resolve(b, schema) for b in node["anyOf"]] if "anyOf" in node else [node]


def undeclared_keys(value: Any, node: dict, schema: dict, path: str = "") -> list[str]:
    """Keys of ``value`` that the chart does not declare, wherever the chart declares the keys of an object.

    The schema itself leaves several chart objects open (``additionalProperties`` absent or true: the top
    level, a user deployment...), where Helm would ignore a misspelled key silently. Free-form maps
    (``additionalProperties`` is a schema: env, labels, node selectors) and Kubernetes objects (external
    ``$ref``: validated strictly by the validator above) are left to the validator.
    """
    branches = _branches(node, schema)
    if isinstance(value, dict):
        objects = [b for b in branches if b.get("type") == "object" or "properties" in b]
        if not objects:
            return []
        obj = max(objects, key=lambda b: len(b.get("properties") or {}))
        props = obj.get("properties") or {}
        ref = obj.get("$ref")
        if not props or isinstance(obj.get("additionalProperties"), dict) or (ref and not ref.startswith("#")):
            return []
        out = []
        for key, sub in value.items():
            if key not in props:
                out.append(f"{path}.{key}".lstrip("."))
            else:
                out += undeclared_keys(sub, props[key], schema, f"{path}.{key}")
        return out
    if isinstance(value, list):
        arrays = [b for b in branches if "items" in b]
        if not arrays:
            return []
        return [
            bad
            for i, item in enumerate(value)
            for bad in undeclared_keys(item, arrays[0]["items"], schema, f"{path}[{i}]")
        ]
    return []


def values_problems(values: dict, schema: dict | None = None) -> list[str]:
    """Every schema error and every undeclared key of ``values`` (empty: the chart accepts it)."""
    schema = schema or chart_schema()
    errors = [
        f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in values_validator(schema).iter_errors(values)
    ]
    return errors + [f"{key}: not a key of the chart" for key in undeclared_keys(values, schema, schema)]


def mutated(values: dict, path: list, change) -> dict:
    """A deep copy of ``values`` with ``change(parent, last_key)`` applied at ``path``."""
    out = copy.deepcopy(values)
    parent = out
    for key in path[:-1]:
        parent = parent[key]
    change(parent, path[-1])
    return out


def from_env() -> K8sSettings:
    """The Kubernetes settings of this test's environment, built as the code location's load builds them."""
    return Settings.from_env().k8s
