"""Fixtures for Dagster-level tests: a real sandbox process, a job spec on disk, a Dagster instance."""

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import dagster as dg
import pytest
import yaml

from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.spec.loading import load_spec
from batch_pipeline.defs.resources import PricesResource, StoreResource
from batch_pipeline.sandbox import SandboxAdmin

from .postgres import PASSWORD_ENV, PostgresServer, postgres_dagster_home, postgres_server

REPO = Path(__file__).resolve().parents[2]
SMALL = REPO / "data" / "samples" / "tickets_small" / "tickets.jsonl"


@pytest.fixture
def sandbox(sandbox_proc, monkeypatch) -> Iterator[SandboxAdmin]:
    """The worker's sandbox, reset for this test and wired in through $BATCH_PIPELINE_SANDBOX_URL."""
    _, url = sandbox_proc
    admin = SandboxAdmin(url, timeout=60.0)  # 10 s timed out on a loaded machine, mid-run with the sandbox busy
    admin.reset()
    monkeypatch.setenv("BATCH_PIPELINE_SANDBOX_URL", url)
    yield admin


@pytest.fixture
def home(tmp_path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def resources(home) -> dict:
    return {"store": StoreResource(root=str(home)), "prices": PricesResource(path=str(REPO / "data" / "prices.yaml"))}


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.DagsterInstance.ephemeral() as inst:
        yield inst


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """Debian's PostgreSQL on a free loopback port (one per test process), stopped by PID at the end."""
    with postgres_server() as server:
        yield server


@pytest.fixture
def postgres_instance(postgres, tmp_path, monkeypatch, request) -> Iterator[dg.DagsterInstance]:
    """A Dagster instance loaded from a DAGSTER_HOME whose dagster.yaml keeps it in Postgres (a fresh database)."""
    monkeypatch.setenv(PASSWORD_ENV, postgres.password)
    db = postgres.create_database(f"t_{abs(hash(request.node.nodeid)):x}")
    home = postgres_dagster_home(tmp_path / "dagster_home", postgres, db)
    with dg.DagsterInstance.from_config(str(home)) as inst:
        assert type(inst.run_storage).__name__ == "PostgresRunStorage", type(inst.run_storage)
        yield inst


@pytest.fixture
def make_job(tmp_path) -> Callable[..., JobSpec]:
    """Write input rows and a job spec (the demo's, with overrides) into tmp_path; return the loaded spec."""

    def make(name: str = "t", rows: list[dict] | None = None, **overrides) -> JobSpec:
        data = tmp_path / "data"
        (data / "jobs").mkdir(parents=True, exist_ok=True)
        inputs = data / "in"
        inputs.mkdir(exist_ok=True)
        if rows is None:
            shutil.copy(SMALL, inputs / "rows.jsonl")
        else:
            (inputs / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        spec = yaml.safe_load((REPO / "data" / "jobs" / "demo.yaml").read_text())
        spec.update(name=name, input={**spec["input"], "path": str(inputs / "*.jsonl")}, shards={"max_requests": 10})
        spec.pop("quality", None)  # golden gates only where a test asks for them (quality=...)
        for key, value in overrides.items():
            spec[key] = value
        path = data / "jobs" / f"{name}.yaml"
        path.write_text(yaml.safe_dump(spec))
        return load_spec(path)

    return make


def ledger_ids(admin: SandboxAdmin) -> list[str]:
    return [e["custom_id"] for e in admin.ledger()]


def batch_creates(admin: SandboxAdmin) -> int:
    return sum(
        1 for r in admin.requests() if r["method"] == "POST" and r["path"] == "/v1/batches" and r["status"] == 200
    )
