"""The project's ``dagster.yaml`` loaded into a real Dagster instance: run monitoring as configured, and every
other setting accepted by Dagster's own config schema."""

import shutil
from pathlib import Path

import dagster as dg

DAGSTER_YAML = Path(__file__).resolve().parents[2] / "dagster.yaml"


def test_dagster_yaml_enables_run_monitoring_with_our_timeouts_and_no_resume(tmp_path):
    shutil.copy(DAGSTER_YAML, tmp_path / "dagster.yaml")
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        assert instance.run_monitoring_enabled
        assert instance.run_monitoring_start_timeout_seconds == 300
        assert instance.run_monitoring_cancel_timeout_seconds == 300
        # a dead run worker's run is failed, never resumed by Dagster: re-running resumes it from the store
        assert instance.run_monitoring_max_resume_run_attempts == 0
        assert instance.run_monitoring_settings == {
            "enabled": True,
            "start_timeout_seconds": 300,
            "cancel_timeout_seconds": 300,
            "max_resume_run_attempts": 0,
        }
        assert instance.root_directory == str(tmp_path)  # this file, not another DAGSTER_HOME's
