"""Where a job's spec is written, and reading it from there: ``core/spec/job_files.py``, under the name the CLI
(``cli_jobs``) and the dg Component (``defs/``) import it by. It lives in core because ``input.from_job`` looks a
job's upstream up in both places (``core/manifest/upstream.py``), and core imports nothing outside itself.
"""

from batch_pipeline.core.spec.job_files import (
    COMPONENT_TYPE,
    DEFAULT_JOBS,
    DEFS_FILE,
    DEFS_FOLDER,
    defs_folder_jobs,
    is_component_doc,
    load_defs_yaml,
    load_job_file,
    placed,
    project_root_of,
    sibling_job_files,
)

__all__ = [
    "COMPONENT_TYPE",
    "DEFAULT_JOBS",
    "DEFS_FILE",
    "DEFS_FOLDER",
    "defs_folder_jobs",
    "is_component_doc",
    "load_defs_yaml",
    "load_job_file",
    "placed",
    "project_root_of",
    "sibling_job_files",
]
