"""One settings object for every BATCH_PIPELINE_* variable: one default each, errors that name the variable."""

from pathlib import Path

import pytest

from batch_pipeline.core.errors import ConfigError
from batch_pipeline.core.settings import PROJECT_ROOT, Settings
from batch_pipeline.core.store import Store


def test_defaults_when_nothing_is_set(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = Settings.from_env({})
    assert s.home == str(tmp_path / ".batch_pipeline")
    assert s.jobs == PROJECT_ROOT / "data" / "jobs" and s.prices == PROJECT_ROOT / "data" / "prices.yaml"
    assert (s.sandbox_url, s.sensor_interval_s, s.lease_ttl_s) == (None, 30, None)
    assert s.prices.is_file() and (s.jobs / "demo.yaml").is_file()  # the defaults point at the checkout's files


def test_the_store_and_the_settings_share_one_default_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("BATCH_PIPELINE_HOME",):
        monkeypatch.delenv(name, raising=False)
    assert Path(Store().root) == Path(Settings.from_env().home).resolve()
    monkeypatch.setenv("BATCH_PIPELINE_HOME", str(tmp_path / "elsewhere"))
    assert Path(Store().root) == tmp_path / "elsewhere"


def test_values_come_from_the_environment():
    s = Settings.from_env(
        {
            "BATCH_PIPELINE_HOME": "s3://bucket/prefix",
            "BATCH_PIPELINE_SENSOR_INTERVAL_S": "5",
            "BATCH_PIPELINE_LEASE_TTL_S": "2.5",
            "BATCH_PIPELINE_SANDBOX_URL": " http://127.0.0.1:9 ",
        }
    )
    assert (s.home, s.sensor_interval_s, s.lease_ttl_s, s.sandbox_url) == (
        "s3://bucket/prefix",
        5,
        2.5,
        "http://127.0.0.1:9",
    )


@pytest.mark.parametrize(
    ("name", "value"), [("SENSOR_INTERVAL_S", "soon"), ("LEASE_TTL_S", "0"), ("SENSOR_INTERVAL_S", "-3")]
)
def test_a_bad_value_names_the_variable(name, value):
    with pytest.raises(ConfigError, match=f"BATCH_PIPELINE_{name}='{value}'"):
        Settings.from_env({f"BATCH_PIPELINE_{name}": value})
