"""The sensor tier once more on a Dagster instance kept in a real Postgres, as the Helm deployment keeps it.

The same tests as ``test_sensors`` and ``test_ranged_runs`` (collected here again); only ``instance`` differs: it
is loaded from a DAGSTER_HOME whose dagster.yaml has ``storage: postgres`` (``conftest.postgres_instance``).
"""

import dagster as dg
import pytest

from .test_ranged_runs import (  # noqa: F401  (collected here, on Postgres)
    test_a_failed_range_is_asked_again_shard_by_shard_and_a_shard_that_keeps_failing_waits,
    test_a_range_in_flight_holds_the_shards_it_moves_not_those_it_steps_over,
    test_a_range_run_moves_only_the_shards_it_names,
    test_runs_per_tick_are_bounded,
)
from .test_sensors import (  # noqa: F401
    test_driver_requotes_before_submitting_when_the_quote_expired,
    test_driver_skips_a_stopped_job_and_resubmits_retryable_shards,
    test_dropped_file_drives_manifest_then_shards_then_publish,
    test_new_data_sensor_fires_once_per_change,
)


@pytest.fixture
def instance(postgres_instance) -> dg.DagsterInstance:
    return postgres_instance


def test_the_instance_is_postgres(instance):
    from dagster_postgres import PostgresEventLogStorage, PostgresRunStorage

    assert isinstance(instance.run_storage, PostgresRunStorage)
    assert isinstance(instance.event_log_storage, PostgresEventLogStorage)
    run = instance.add_run(dg.DagsterRun(job_name="probe", run_id="0" * 36, status=dg.DagsterRunStatus.SUCCESS))
    assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.SUCCESS
