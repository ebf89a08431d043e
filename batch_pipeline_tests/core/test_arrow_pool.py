"""The Arrow memory pool a process runs on: chosen at each edge of a process from its settings."""

import logging

import pyarrow as pa
import pytest

from batch_pipeline.cli_jobs import cli_settings
from batch_pipeline.core.arrow_pool import use_arrow_pool
from batch_pipeline.core.errors import ConfigError
from batch_pipeline.core.settings import Settings
from batch_pipeline.defs.project import project_definitions

pytestmark = pytest.mark.usefixtures("arrow_pool_restored")  # each test leaves the worker's pool as it found it


def test_the_default_is_jemalloc_and_this_build_has_it():
    # the default only helps where pyarrow has jemalloc; the Linux wheels do, and CI runs on Linux
    assert Settings.from_env({}).arrow_memory_pool == "jemalloc"
    assert "jemalloc" in pa.supported_memory_backends()


@pytest.mark.parametrize("name", ["system", "jemalloc", "mimalloc"])
def test_a_pool_is_made_the_default_of_pyarrow_calls(name):
    assert use_arrow_pool(name) == name
    assert pa.default_memory_pool().backend_name == name
    assert pa.array([b"x" * 100] * 10).nbytes > 0  # allocations work on it
    assert use_arrow_pool(name) == name  # again: nothing changes


def test_a_pool_this_build_lacks_keeps_the_one_in_use(caplog):
    use_arrow_pool("system")
    with caplog.at_level(logging.INFO, logger="batch_pipeline.core.arrow_pool"):
        assert use_arrow_pool("tcmalloc") == "system"
    assert pa.default_memory_pool().backend_name == "system"
    assert "'tcmalloc' is not in this pyarrow build" in caplog.text


def test_the_cli_edge_applies_the_setting(monkeypatch):
    monkeypatch.setenv("BATCH_PIPELINE_ARROW_MEMORY_POOL", "system")
    assert cli_settings(None).arrow_memory_pool == "system"
    assert pa.default_memory_pool().backend_name == "system"
    monkeypatch.setenv("BATCH_PIPELINE_ARROW_MEMORY_POOL", "jemalloc")
    cli_settings(None)
    assert pa.default_memory_pool().backend_name == "jemalloc"


def test_the_code_location_edges_apply_the_setting(monkeypatch):
    # the code location's load and each Component's load (the demo job is one) read the same environment
    monkeypatch.setenv("BATCH_PIPELINE_ARROW_MEMORY_POOL", "system")
    project_definitions()
    assert pa.default_memory_pool().backend_name == "system"


def test_a_pool_that_is_no_choice_names_the_variable():
    with pytest.raises(ConfigError, match="BATCH_PIPELINE_ARROW_MEMORY_POOL='tcmalloc'"):
        Settings.from_env({"BATCH_PIPELINE_ARROW_MEMORY_POOL": "tcmalloc"})


def test_a_component_load_applies_its_environment(monkeypatch):
    # handed settings that say jemalloc, the code location applies them; the demo Component then loads with
    # the environment's settings (its own edge), which say system
    monkeypatch.setenv("BATCH_PIPELINE_ARROW_MEMORY_POOL", "system")
    project_definitions(Settings.from_env({}))
    assert pa.default_memory_pool().backend_name == "system"
