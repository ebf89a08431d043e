"""The registry's backend limits reach the sharder: shards never exceed what the backend accepts."""

import importlib
import json

import pyarrow.compute as pc
import pytest

from batch_pipeline.core.errors import ConfigError
from batch_pipeline.core.manifest.shards import Manifest, ShardCaps, build_manifest
from batch_pipeline.core.spec.job import BackendSpec
from batch_pipeline.core.spec.loading import parse_spec
from batch_pipeline.core.store import Store
from batch_pipeline.executors.quota import QueueCapped
from batch_pipeline.executors.registry import (
    EXECUTORS,
    PROVIDER_SETTINGS,
    account_pool,
    batch_limits,
    create_executor,
    executor_class,
)

SDKS = ("openai", "anthropic", "google.genai", "boto3", "bpe_openai")
# what `batch-pipeline run` and a code location load before any job runs: the project's definitions name each job's
# Dagster pool (the demo's on openai_batch) from its settings, which must not need the SDK
LOADED = """
import json, sys
import batch_pipeline.cli, batch_pipeline.defs.pipeline, batch_pipeline.defs.sensors, batch_pipeline.definitions
from batch_pipeline.executors.registry import executor_class
before = sorted(m for m in sys.modules if m.split(".")[0] in {s.split(".")[0] for s in json.loads(sys.argv[1])})
executor_class("anthropic_batch")
print(json.dumps({"before": before, "after": "anthropic" in sys.modules}))
"""


def test_a_process_imports_the_sdk_of_the_backend_it_runs_only():
    """Each SDK costs 0.3-2.3 s to import (anthropic ~2 s); before the table was lazy, every CLI run and code
    location paid ~5 s for all of them."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", LOADED, json.dumps(SDKS)], capture_output=True, text=True, check=True)
    seen = json.loads(out.stdout)
    assert seen["before"] == [] and seen["after"] is True, seen


def test_every_registered_class_states_its_own_name_settings_and_limits():
    for name in EXECUTORS:
        cls = executor_class(name)
        assert cls.name == name and cls.settings_model.model_config.get("extra") == "forbid", name
        batch_api = hasattr(cls, "submit")
        required = ("submit", "poll", "fetch", "cancel", "find") if batch_api else ("run",)
        assert all(callable(getattr(cls, method, None)) for method in required), name
        limits = batch_limits(name)
        if batch_api:  # the sharder needs both caps of a provider batch API, read off the class itself
            assert limits == (cls.max_requests_per_batch, cls.max_bytes_per_batch) and all(v > 0 for v in limits), name
        else:
            assert limits == (None, None), name


def test_the_provider_settings_table_lists_every_queue_capped_backend_with_its_own_settings():
    capped = {name for name in EXECUTORS if issubclass(executor_class(name), QueueCapped)}
    assert set(PROVIDER_SETTINGS) == capped and len(capped) == 6
    for name, where in PROVIDER_SETTINGS.items():
        module, attr = where.split(":")
        assert executor_class(name).settings_model is getattr(importlib.import_module(module), attr), name
    settings = {"accounts": [{"name": "team-a", "api_key_env": "KEY_A"}, {"api_key_env": "KEY_B"}]}
    assert account_pool(BackendSpec(name="openai_batch")) == "openai_batch/OPENAI_API_KEY"
    assert account_pool(BackendSpec(name="anthropic_batch", settings=settings)) == "anthropic_batch/team-a+KEY_B"
    assert account_pool(BackendSpec(name="online")) is None
    with pytest.raises(ConfigError, match="'nope' is not a known executor"):
        account_pool(BackendSpec(name="nope"))
    with pytest.raises(ConfigError, match="backend.settings for gemini_batch: colour: .* GeminiBatchSettings"):
        account_pool(BackendSpec(name="gemini_batch", settings={"colour": "red"}))


def test_unknown_backends_and_settings_are_config_errors_naming_them():
    with pytest.raises(ConfigError, match=r"'nope' is not a known executor; known: \[.*'openai_batch'"):
        create_executor(BackendSpec(name="nope"))
    with pytest.raises(ConfigError, match="^backend.settings for openai_batch: colour: Extra inputs are not permitted"):
        create_executor(BackendSpec(name="openai_batch", settings={"colour": "red"}))


def test_backend_limits_cap_the_job_shard_size(tmp_path):
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"body": f"row number {i}"}) + "\n" for i in range(30)))
    spec = parse_spec(f"""
name: caps
input: {{path: {tmp_path}/in.jsonl, text_field: body}}
prompt: {{version: v1, template: "{{body}}"}}
model: gpt-4o-mini
backend: {{name: openai_batch}}
sampling: {{max_tokens: 4}}
output: {{text: {{}}}}
shards: {{max_requests: 1000}}
""")
    caps = ShardCaps.of(spec, 7, None)
    assert caps == ShardCaps(7, spec.shards.max_bytes)
    store = Store(tmp_path / "home")
    summary = build_manifest(spec, store, caps=caps)
    sizes = [Manifest("caps", store).shard_items(s).num_rows for s in summary.new_shards]
    assert sum(sizes) == 30 and max(sizes) <= 7
    # a byte cap: each line costs its text plus the framing, so at most a few fit
    store2 = Store(tmp_path / "home2")
    summary = build_manifest(spec, store2, caps=ShardCaps(1000, 2000))
    for sid in summary.new_shards:
        t = Manifest("caps", store2).shard_items(sid)
        assert pc.sum(t.column("request_bytes")).as_py() + 512 * t.num_rows <= 2000


def test_a_request_larger_than_a_whole_batch_is_rejected_not_sharded(tmp_path):
    rows = [{"body": "short text"}, {"body": "x " * 3000}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = parse_spec(f"""
name: big
input: {{path: {tmp_path}/in.jsonl, text_field: body}}
prompt: {{version: v1, template: "{{body}}"}}
model: gpt-4o-mini
backend: {{name: openai_batch}}
sampling: {{max_tokens: 4}}
output: {{text: {{}}}}
""")
    store = Store(tmp_path / "home")
    summary = build_manifest(spec, store, caps=ShardCaps(100, 4000))
    assert summary.new_requests == 1 and summary.rejects_by_reason == {"too_large": 1}
    reject = Manifest("big", store).rejects().to_pylist()[0]
    assert reject["line"] == 2 and "4000 bytes" in reject["reason"]
