"""Several `batch-pipeline run` processes started together on a fresh DAGSTER_HOME (two teams' jobs, or a test's
two jobs at once): each makes the Dagster instance, and none fails creating its sqlite tables. Without the home's
lock one of six processes failed most rounds with "table alembic_version already exists"."""

import os
import subprocess
import sys

MAKE_INSTANCE = "from batch_pipeline.cli import _dagster_instance; _dagster_instance().dispose()"


def test_processes_starting_together_on_a_fresh_dagster_home_all_get_its_instance(tmp_path):
    home = tmp_path / "dagster_home"
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", MAKE_INSTANCE], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for _ in range(6)
    ]
    outputs = [p.communicate(timeout=240)[0] for p in procs]
    failed = [out for p, out in zip(procs, outputs) if p.returncode != 0]
    assert not failed, failed[0][-2000:]
    assert (home / "dagster.yaml").exists() and (home / "schedules").is_dir()
