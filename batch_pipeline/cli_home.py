"""The CLI's DAGSTER_HOME: found or made (with the project's dagster.yaml), and its instance, one process at a time."""

import fcntl
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from batch_pipeline.core.settings import PROJECT_ROOT


@contextmanager
def _home_lock(home: Path):
    """One process at a time sets up a DAGSTER_HOME: two runs started together on a fresh one both created its
    sqlite tables, and one failed ("table alembic_version already exists")."""
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".batch_pipeline.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def dagster_home() -> Path:
    home = Path(os.environ.get("DAGSTER_HOME") or Path.cwd() / ".dagster_home").resolve()
    with _home_lock(home):
        if not (home / "dagster.yaml").exists() and (PROJECT_ROOT / "dagster.yaml").exists():
            shutil.copy(PROJECT_ROOT / "dagster.yaml", home / "dagster.yaml")
    os.environ["DAGSTER_HOME"] = str(home)
    return home


def dagster_instance():
    """The instance of $DAGSTER_HOME, its storages made under the home's lock (see `_home_lock`)."""
    import dagster as dg

    with _home_lock(dagster_home()):
        instance = dg.DagsterInstance.get()
        for storage in (instance.run_storage, instance.event_log_storage, instance.schedule_storage):
            assert storage is not None  # built now, under the lock
    return instance
