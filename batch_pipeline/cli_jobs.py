"""One way to name a job on the command line: a spec path (a ``data/jobs``-style spec or a Component's
``defs.yaml``), or the name of a job.

A name is looked up first where the job's last run recorded its spec (``JobPaths.spec_source`` under the storage
root, written by ``run``), then in the jobs folder (``data/jobs/<name>.yaml``), then in the dg project's defs
folder (``batch_pipeline/jobs/<name>/defs.yaml``, or any ``defs.yaml`` there declaring job ``name``). So
``batch-pipeline run /anywhere/job.yaml`` followed by ``batch-pipeline status job`` reads the same spec.
"""

from pathlib import Path

from batch_pipeline.core.arrow_pool import use_arrow_pool
from batch_pipeline.core.errors import ConfigError
from batch_pipeline.core.settings import Settings
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.spec.job_files import DEFS_FOLDER, defs_folder_jobs, load_job_file
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store


def cli_settings(home: str | None) -> Settings:
    """The CLI's edge: the settings of the environment, on ``--home`` when given; every command gets these."""
    settings = Settings.from_env()
    use_arrow_pool(settings.arrow_memory_pool)
    return settings.with_home(home) if home else settings


def store_for(settings: Settings) -> Store:
    """The storage root a command reads: ``--home``, else ``$BATCH_PIPELINE_HOME``, else ./.batch_pipeline."""
    return Store.of(settings)


def _looks_like_path(arg: str) -> bool:
    return arg.endswith((".yaml", ".yml")) or "/" in arg or "\\" in arg


def resolve_job(arg: str, settings: Settings) -> JobSpec:
    """The spec ``arg`` names (a path, or a job name); a ConfigError naming every place looked otherwise."""
    path = Path(arg)
    if path.is_file() or _looks_like_path(arg):
        return load_job_file(path)  # a path that cannot be read says so, with the path
    store = store_for(settings)
    recorded = store.read_json(JobPaths(arg).spec_source) or {}
    recorded_path = recorded.get("path")
    if recorded_path and Path(recorded_path).is_file():
        return load_job_file(recorded_path)
    in_jobs = settings.jobs / f"{arg}.yaml"
    if in_jobs.is_file():
        return load_job_file(in_jobs)
    in_defs = defs_folder_jobs().get(arg)
    if in_defs is not None:
        return load_job_file(in_defs)
    where = f"the spec recorded by its last run ({store.uri(JobPaths(arg).spec_source)}" + (
        f" names {recorded_path}, which is gone)" if recorded_path else ": none)"
    )
    raise ConfigError(
        f"no job {arg!r}: looked at {where}, in the jobs folder ({in_jobs}: not found) and in the defs folder "
        f"({DEFS_FOLDER / arg / 'defs.yaml'}: not found); pass the spec's path, or run it once with "
        "`batch-pipeline run PATH`"
    )


def remember_spec(spec: JobSpec, store: Store) -> None:
    """Record where the spec of this run lives, so later commands find it by the job's name."""
    if spec.source_path:
        store.write_json(JobPaths(spec.name).spec_source, {"path": str(Path(spec.source_path).resolve())})
