"""Where a job's spec is written, and reading it from there (no dagster). In core because a job's ``input.from_job``
is looked up in both places (``core/manifest/upstream.py``); the CLI and the dg Component import it as
``batch_pipeline.job_files``.

Two places, one spec each: ``data/jobs/<job>.yaml`` (the jobs folder, ``$BATCH_PIPELINE_JOBS``), read by
``core/spec/loading.py``; and ``batch_pipeline/jobs/<job>/defs.yaml`` (the dg project's defs folder), a
``batch_pipeline.BatchInferenceJob`` Component whose ``attributes`` are the spec. Relative paths in a ``defs.yaml``
(``input.path``, ``quality.golden``) are read from the project root, as those of a ``data/jobs/`` spec are; a
``defs.yaml`` that does not validate is a ConfigError naming the file, the line and the field.
"""

from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import ValidationError

from batch_pipeline.core.errors import ConfigError
from batch_pipeline.core.settings import PROJECT_ROOT
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.spec.loading import _format_errors, load_spec

COMPONENT_TYPE = "batch_pipeline.BatchInferenceJob"
DEFS_FILE = "defs.yaml"

S = TypeVar("S", bound=JobSpec)


def project_places(project_root: Path) -> tuple[Path, Path]:
    """A project's jobs folder and its defs folder (pyproject ``[tool.dg.project] defs_module``)."""
    root = Path(project_root).resolve()
    return root / "data" / "jobs", root / "batch_pipeline" / "jobs"


DEFAULT_JOBS, DEFS_FOLDER = project_places(PROJECT_ROOT)


def _from_root(path: str, root: Path) -> str:
    if "://" in path or Path(path).is_absolute():
        return path
    return str(root / path)


def placed(spec: S, defs_yaml: Path, project_root: Path) -> S:
    """The spec as read from ``defs_yaml``: its source recorded, its relative paths made project-root ones."""
    root = Path(project_root).resolve()
    update: dict = {"source_path": str(Path(defs_yaml).resolve())}
    if spec.input.path is not None:
        update["input"] = spec.input.model_copy(update={"path": _from_root(spec.input.path, root)})
    if spec.quality is not None and spec.quality.golden:
        update["quality"] = spec.quality.model_copy(update={"golden": _from_root(spec.quality.golden, root)})
    return spec.model_copy(update=update)


def project_root_of(path: Path) -> Path:
    """The dg project a ``defs.yaml`` belongs to: the nearest folder above it with a pyproject.toml."""
    for folder in Path(path).resolve().parents:
        if (folder / "pyproject.toml").is_file():
            return folder
    return PROJECT_ROOT


def is_component_doc(doc: object) -> bool:
    return isinstance(doc, dict) and doc.get("type") == COMPONENT_TYPE and isinstance(doc.get("attributes"), dict)


def load_defs_yaml(path: str | Path) -> JobSpec:
    """The job spec of a ``defs.yaml``'s attributes, or a ConfigError naming its file, line and field."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        root = yaml.compose(text)
        doc = yaml.safe_load(text)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read job spec: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not is_component_doc(doc):
        raise ConfigError(f"{path}: not a {COMPONENT_TYPE} (type: {COMPONENT_TYPE}, attributes: the job spec)")
    node = next((v for k, v in root.value if getattr(k, "value", None) == "attributes"), None)
    try:
        spec = JobSpec.model_validate(doc["attributes"])
    except ValidationError as exc:
        raise ConfigError(_format_errors(str(path), exc, node).replace("field '", "field 'attributes.")) from None
    return placed(spec, path, project_root_of(path))


def load_job_file(path: str | Path) -> JobSpec:
    """A spec file of either kind: a ``defs.yaml`` Component, or a ``data/jobs/`` spec."""
    return load_defs_yaml(path) if Path(path).name == DEFS_FILE else load_spec(path)


def defs_folder_jobs(folder: Path = DEFS_FOLDER) -> dict[str, Path]:
    """The defs folder's jobs by name: each ``defs.yaml`` of type ``BatchInferenceJob`` (read as YAML only)."""
    out: dict[str, Path] = {}
    for path in sorted(Path(folder).rglob(DEFS_FILE)):
        try:
            doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            continue
        if is_component_doc(doc):
            out.setdefault(str(doc["attributes"].get("name")), path)
    return out


def sibling_job_files(source_path: str | Path) -> list[Path]:
    """The spec files whose jobs a job's ``input.from_job`` may name, its own place first: a jobs folder's specs
    are those beside it, and the project's defs folder Components too when that folder is the project's jobs
    folder (as ``defs/project.py`` pairs them); a ``defs.yaml``'s are its project's Components and jobs folder."""
    path = Path(source_path).resolve()
    jobs, defs = project_places(project_root_of(path))
    if path.name == DEFS_FILE:
        return [*defs_folder_jobs(defs).values(), *sorted(jobs.glob("*.yaml"))]
    own = sorted(path.parent.glob("*.yaml"))
    return [*own, *defs_folder_jobs(defs).values()] if path.parent == jobs else own
