"""``batch_pipeline.BatchInferenceJob``: one job spec as a Dagster Component.

A ``<defs folder>/<job>/defs.yaml`` says ``type: batch_pipeline.BatchInferenceJob``, and its ``attributes`` are the
job spec (the keys of a ``data/jobs/*.yaml`` spec, validated by the same pydantic model: unknown keys refused).
Relative paths in it (``input.path``, ``quality.golden``) are read from the project root, as those of a
``data/jobs/`` spec are. ``build_defs`` returns the job's assets, checks, jobs, sensors and schedules
(``build.build_job_defs``); the resources and the executor are the code location's (``definitions.py``).
"""

from pathlib import Path

import dagster as dg
import yaml
from pydantic import Field, ValidationError
from pydantic.json_schema import SkipJsonSchema

from batch_pipeline.core.errors import ConfigError
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.spec.loading import _format_errors
from batch_pipeline.defs.build import build_job_defs
from batch_pipeline.defs.scaffold import BatchInferenceJobScaffolder

COMPONENT_TYPE = "batch_pipeline.BatchInferenceJob"
DEFS_FILE = "defs.yaml"


@dg.scaffold_with(BatchInferenceJobScaffolder)
class BatchInferenceJob(JobSpec, dg.Component):
    """A batch inference job: manifest, quote, shard submissions and results, the checked and validated table, dead
    letters and the report, with the jobs and sensors that drive them. The attributes are the job spec."""

    # set by the loader (the defs.yaml it came from), never written in one
    source_path: SkipJsonSchema[str | None] = Field(default=None, exclude=True)

    @classmethod
    def get_model_cls(cls) -> type[JobSpec]:
        return cls  # the attributes are validated as the job spec itself, model validators included

    @classmethod
    def load(cls, attributes: "BatchInferenceJob | None", context: dg.ComponentLoadContext) -> "BatchInferenceJob":
        if attributes is None:
            raise ConfigError(f"{context.path / DEFS_FILE}: a BatchInferenceJob needs attributes (its job spec)")
        return placed(attributes, context.path / DEFS_FILE, context.project_root)

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        return build_job_defs(self)


def _from_root(path: str, root: Path) -> str:
    if "://" in path or Path(path).is_absolute():
        return path
    return str(root / path)


def placed(spec: BatchInferenceJob, defs_yaml: Path, project_root: Path) -> BatchInferenceJob:
    """The spec as loaded from ``defs_yaml``: its source recorded, its relative paths made project-root ones."""
    root = Path(project_root).resolve()
    update: dict = {"source_path": str(Path(defs_yaml).resolve())}
    if spec.input.path is not None:
        update["input"] = spec.input.model_copy(update={"path": _from_root(spec.input.path, root)})
    if spec.quality is not None and spec.quality.golden:
        update["quality"] = spec.quality.model_copy(update={"golden": _from_root(spec.quality.golden, root)})
    return spec.model_copy(update=update)


def is_defs_yaml(path: Path) -> bool:
    return path.name == DEFS_FILE


def load_defs_yaml(path: str | Path, project_root: Path) -> BatchInferenceJob:
    """A ``defs.yaml`` read outside Dagster (the CLI): the job spec of its attributes, or a ConfigError naming the
    file, the line and the field, as ``core/spec/loading.py`` does for a ``data/jobs/`` spec."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        root = yaml.compose(text)
        doc = yaml.safe_load(text)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read job spec: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(doc, dict) or doc.get("type") != COMPONENT_TYPE or not isinstance(doc.get("attributes"), dict):
        raise ConfigError(f"{path}: not a {COMPONENT_TYPE} (type: {COMPONENT_TYPE}, attributes: the job spec)")
    node = next((v for k, v in root.value if getattr(k, "value", None) == "attributes"), None)
    try:
        spec = BatchInferenceJob.model_validate(doc["attributes"])
    except ValidationError as exc:
        raise ConfigError(_format_errors(str(path), exc, node).replace("field '", "field 'attributes.")) from None
    return placed(spec, path, project_root)
