"""The UI-launched e2e flow once more with the instance in a real Postgres (``test_dagster_dev``'s test, collected
here with a DAGSTER_HOME whose dagster.yaml has the chart's `storage: postgres`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ..defs.postgres import PASSWORD_ENV, postgres_dagster_home
from .conftest import DagsterDev, Project, run_dagster_dev
from .test_dagster_dev import test_dagster_dev_runs_a_job_over_graphql  # noqa: F401  (on Postgres)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def e2e_project(e2e_project: Project, postgres) -> Project:
    postgres_dagster_home(e2e_project.dagster_home, postgres, postgres.create_database("e2e_ui"))
    return e2e_project


@pytest.fixture(scope="module")
def dagster_dev(sandbox_proc, e2e_project: Project, postgres) -> Iterator[DagsterDev]:
    _, sandbox_url = sandbox_proc
    with run_dagster_dev(sandbox_url, e2e_project, {PASSWORD_ENV: postgres.password}) as dev:
        yield dev


def test_the_ui_runs_are_in_postgres(dagster_dev: DagsterDev, postgres):
    conn = postgres.connect("e2e_ui")
    with conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM runs")
        (runs,) = cur.fetchone()
    conn.close()
    assert runs >= 4, runs  # prepare, the canary, the shards, publish
    assert not list(dagster_dev.project.dagster_home.rglob("*.db"))
