"""The sensor-driven e2e flow once more with the instance in a real Postgres, as the Helm deployment keeps it.

`dagster dev` (webserver, daemon, code server, run workers) reads a DAGSTER_HOME whose dagster.yaml has
`storage: postgres` in the chart's shape (password from `$DAGSTER_PG_PASSWORD`); the test is
``test_sensors_dev``'s, collected here again with these fixtures.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ..defs.postgres import PASSWORD_ENV, postgres_dagster_home
from .conftest import DagsterDev, Project, run_dagster_dev
from .test_sensors_dev import INTERVAL_S, make_sensor_project
from .test_sensors_dev import test_dropped_file_runs_the_job_through_the_sensors  # noqa: F401  (on Postgres)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

RUNS_IN_DB = "SELECT count(*) FROM runs"


@pytest.fixture(scope="module")
def sensor_project(tmp_path_factory, postgres) -> Project:
    project = make_sensor_project(tmp_path_factory.mktemp("e2e_sensors_postgres"))
    postgres_dagster_home(project.dagster_home, postgres, postgres.create_database("e2e_sensors"))
    return project


@pytest.fixture(scope="module")
def sensor_dev(sandbox_proc, sensor_project: Project, postgres) -> Iterator[DagsterDev]:
    _, sandbox_url = sandbox_proc
    env = {"BATCH_PIPELINE_SENSOR_INTERVAL_S": str(INTERVAL_S), PASSWORD_ENV: postgres.password}
    with run_dagster_dev(sandbox_url, sensor_project, env, workspace=sensor_project.root / "workspace.yaml") as dev:
        yield dev


def test_the_runs_are_in_postgres(sensor_dev: DagsterDev, postgres):
    """Runs after the flow above (tests run in file order): the instance's run table in Postgres holds them, and
    nothing was written to a SQLite file in DAGSTER_HOME."""
    conn = postgres.connect("e2e_sensors")
    with conn.cursor() as cur:
        cur.execute(RUNS_IN_DB)
        (runs,) = cur.fetchone()
    conn.close()
    assert runs >= 6, runs
    assert not list(sensor_dev.project.dagster_home.rglob("*.db")), list(sensor_dev.project.dagster_home.rglob("*"))
