"""The project's jobs: the defs folder's Components and the jobs folder's specs, one code location.

The CLI finds a job by its name in either place (``cli_jobs.resolve_job``). A job declared in both is one job
only if the two specs are the same (``data/jobs/demo.yaml`` and ``batch_pipeline/jobs/demo/defs.yaml``);
different specs under one name are refused, naming both files.
"""

import warnings
from pathlib import Path

import dagster as dg
from dagster_shared.utils.warnings import PreviewWarning

from batch_pipeline.core.arrow_pool import use_arrow_pool
from batch_pipeline.core.errors import ConfigError
from batch_pipeline.core.settings import PROJECT_ROOT, Settings
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.spec.job_files import DEFAULT_JOBS
from batch_pipeline.core.spec.loading import load_specs
from batch_pipeline.defs.build import build_definitions
from batch_pipeline.defs.component import BatchInferenceJob


def uses_project_jobs(settings: Settings) -> bool:
    """Whether the jobs folder is the project's own (then the defs folder's Components are its jobs too)."""
    return Path(settings.jobs).resolve() == DEFAULT_JOBS.resolve()


def comparable(spec: JobSpec) -> dict:
    """What makes two specs the same job: every key, relative paths read from where each spec is."""
    data = spec.model_dump(mode="json", exclude={"source_path"})
    base = spec.input_base_dir()
    if data["input"].get("path") and "://" not in data["input"]["path"]:
        data["input"]["path"] = str((base / data["input"]["path"]).resolve())
    if (data.get("quality") or {}).get("golden"):
        data["quality"]["golden"] = str((base / data["quality"]["golden"]).resolve())
    data["owners"], data["tags"] = list(spec.owners), dict(spec.tags)
    return data


def not_declared(specs: list[JobSpec], components: list[BatchInferenceJob]) -> list[JobSpec]:
    """The jobs folder's specs that no Component declares; one that a Component declares must be the same spec."""
    declared = {c.name: c for c in components}
    out = []
    for spec in specs:
        twin = declared.get(spec.name)
        if twin is None:
            out.append(spec)
        elif comparable(twin) != comparable(spec):
            raise ConfigError(
                f"job {spec.name!r} is declared twice with different specs: {spec.source_path} and "
                f"{twin.source_path}; keep one (a Component in the defs folder, or the spec in the jobs folder)"
            )
    return out


def project_definitions(settings: Settings | None = None) -> dg.Definitions:
    """The code location: its environment's settings (the edge) unless handed some, every job, one executor."""
    settings = settings or Settings.from_env()
    use_arrow_pool(settings.arrow_memory_pool)
    specs = load_specs(settings.jobs)
    if not uses_project_jobs(settings):
        return build_definitions(specs, settings=settings)
    with warnings.catch_warnings():  # the defs folder's __init__.py is loaded as a module: a "preview" API
        warnings.simplefilter("ignore", PreviewWarning)
        tree = dg.ComponentTree.for_project(PROJECT_ROOT)
        components = list(tree.get_all_components(of_type=BatchInferenceJob))
        component_defs = tree.build_defs()
    return dg.Definitions.merge(component_defs, build_definitions(not_declared(specs, components), settings=settings))
