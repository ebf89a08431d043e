"""Shard steps carry one Dagster pool per provider account, shared by every job that sends to that account."""

from pathlib import Path

import yaml

from batch_pipeline.defs.assets import build_job_assets
from batch_pipeline.defs.k8s import GPU_POOL

REPO = Path(__file__).resolve().parents[2]


def shard_pools(spec) -> dict[str, str | None]:
    assets, _ = build_job_assets(spec)
    return {a.key.path[-1]: a.op.pool for a in assets if a.key.path[-1] in ("submissions", "shard_results")}


def test_jobs_on_one_account_share_its_pool_and_other_accounts_have_their_own(make_job, monkeypatch):
    monkeypatch.setenv("BATCH_PIPELINE_SANDBOX_URL", "http://127.0.0.1:9")
    triage = make_job("triage")
    embed = make_job("embed")
    other = make_job(
        "other", backend={"name": "openai_batch", "settings": {"sandbox": True, "api_key_env": "TEAM_B_KEY"}}
    )
    named = make_job("named", backend={"name": "anthropic_batch", "settings": {"sandbox": True, "account": "shared"}})
    assert shard_pools(triage) == {
        "submissions": "openai_batch/OPENAI_API_KEY",
        "shard_results": "openai_batch/OPENAI_API_KEY",
    }
    assert shard_pools(embed) == shard_pools(triage)
    assert set(shard_pools(other).values()) == {"openai_batch/TEAM_B_KEY"}
    assert set(shard_pools(named).values()) == {"anthropic_batch/shared"}
    spread = make_job(
        "spread",
        backend={
            "name": "openai_batch",
            "settings": {
                "sandbox": True,
                "accounts": [{"api_key_env": "A_KEY"}, {"api_key_env": "B_KEY", "name": "team-b"}],
            },
        },
    )
    assert set(shard_pools(spread).values()) == {"openai_batch/A_KEY+team-b"}


def test_self_hosted_steps_keep_the_gpu_pool_and_online_steps_have_none(make_job):
    assert set(shard_pools(make_job("gpu", backend={"name": "vllm", "settings": {"model_path": "/m"}})).values()) == {
        GPU_POOL
    }
    assert set(shard_pools(make_job("web", backend={"name": "online", "settings": {"sandbox": True}})).values()) == {
        None
    }


def test_the_instance_gives_every_pool_a_limit():
    local = yaml.safe_load((REPO / "dagster.yaml").read_text())
    assert local["concurrency"]["pools"]["default_limit"] >= 1
    helm = yaml.safe_load((REPO / "k8s" / "helm" / "values.yaml").read_text())
    assert helm["concurrency"]["pools"]["defaultLimit"] >= 1
