"""A fallback on another kind of backend than the primary, through Dagster against the sandbox (real SDKs): a stream
primary's batch fallback is collected, and a fallback backend's own minimum per batch (Bedrock's records per job) is
respected: below it nothing is created, the fallback model answers on the tail backend, or the shard waits and says
why."""

import polars as pl
import pytest
import yaml

from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.state.view import load_view
from batch_pipeline.core.store import Store
from batch_pipeline.defs.pipeline import run_job
from batch_pipeline.defs.resources import PricesResource, StoreResource
from batch_pipeline.executors.registry import batch_minimums

from .conftest import REPO

RETRIES = {"per_item": 2, "spend_cap_share": 1.0}
CLAUDE = "anthropic.claude-3-5-haiku-20241022-v1:0"
BEDROCK = {"name": "bedrock_batch", "settings": {"sandbox": True}}  # min_records: 100, the sandbox's too
ROW = {"input_per_mtok": 0.80, "output_per_mtok": 4.00, "checked": "2026-12-01"}


@pytest.fixture
def resources(home, tmp_path) -> dict:
    """The repo's prices, and the Claude model online too (the tail answering with the fallback model)."""
    table = yaml.safe_load((REPO / "data" / "prices.yaml").read_text())
    table["prices"]["online"].setdefault(CLAUDE, {**ROW, "batch_discount": 0.0})
    path = tmp_path / "prices.yaml"
    path.write_text(yaml.safe_dump(table))
    return {"store": StoreResource(root=str(home)), "prices": PricesResource(path=str(path))}


def bedrock_creates(admin) -> list[dict]:
    return [r for r in admin.requests() if r["method"] == "POST" and r["path"] == "/model-invocation-job"]


def validated(home, job: str) -> pl.DataFrame:
    return pl.read_parquet(Store(home).read_bytes(JobPaths(job).validated))


def test_a_stream_primarys_batch_fallback_is_collected(sandbox, make_job, instance, resources, home):
    # every online call answers 500: each item spends the primary's budget online (2 tries), then the fallback's
    # batch on openai_batch answers it; that batch must be collected, not left open at the provider
    spec = make_job(
        backend={"name": "online", "settings": {"sandbox": True, "max_attempts_per_request": 1}},
        fallback={"model": "gpt-4o", "backend": {"name": "openai_batch", "settings": {"sandbox": True}}},
        retries=RETRIES,
        canary_first=False,
    )
    sandbox.set_scenario("server_error", times=100_000, on=["chat_completions"])
    report = run_job(spec, instance, resources)
    assert report["complete"] and report["dead_lettered"] == 0 and report["succeeded"] == report["unique_requests"]
    table = validated(home, spec.name)
    assert set(table["model"]) == {"gpt-4o"} and table.height == 40
    billed = [e["custom_id"] for e in sandbox.ledger()]
    assert sorted(billed) == sorted(table.filter(~pl.col("is_duplicate"))["request_id"].to_list())  # once each
    assert report["fallback"]["answered"] == report["unique_requests"]
    batches = [r for r in sandbox.requests() if r["method"] == "POST" and r["path"] == "/v1/batches"]
    assert batches and all(r["status"] == 200 for r in batches)


def test_a_fallback_below_its_backends_minimum_sends_no_batch_and_the_shard_says_why(
    sandbox, make_job, instance, resources, home
):
    spec = make_job(retries=RETRIES, canary_first=False, fallback={"model": CLAUDE, "backend": BEDROCK})
    sandbox.set_scenario("line_errors", rate=0.3, times=3)  # ~30% of the items spend the primary's budget
    report = run_job(spec, instance, resources)
    assert bedrock_creates(sandbox) == []  # never a job of fewer records than Bedrock takes
    # published as it stands: the items the primary gave up are dead letters until the fallback can take them
    assert report["fallback"]["answered"] == 0 and 0 < report["dead_lettered"] < 40
    plan = load_view(spec, Store(home), **batch_minimums(spec)).plan()
    assert plan.waiting and not plan.steps  # nothing to send, nothing to publish: they wait, and say why
    assert sum(int(why.split(" item(s)")[0]) for why in plan.waiting.values()) == report["dead_lettered"]
    for why in plan.waiting.values():
        assert "the primary could not answer for the fallback model" in why
        assert "below the fallback backend's minimum of 100 per batch; they wait" in why


def test_below_the_minimum_the_fallback_model_answers_on_the_tail_backend(sandbox, make_job, instance, resources, home):
    spec = make_job(
        retries=RETRIES,
        canary_first=False,
        fallback={"model": CLAUDE, "backend": BEDROCK},
        tail={"backend": {"name": "online", "settings": {"sandbox": True}}},
    )
    sandbox.set_scenario("line_errors", rate=0.3, times=3)
    report = run_job(spec, instance, resources)
    assert bedrock_creates(sandbox) == []
    assert report["complete"] and report["dead_lettered"] == 0
    table = validated(home, spec.name).filter(~pl.col("is_duplicate"))
    answered = table.filter(pl.col("model") == CLAUDE)
    assert answered.height > 0 and report["fallback"]["answered"] == answered.height
    online = [e for e in sandbox.ledger() if e.get("mode") == "online"]
    assert {e["model"] for e in online} == {CLAUDE} and len(online) == answered.height  # one paid answer each
