"""Backend comparison and the self-hosted break-even."""

import pytest

from batch_pipeline.core.manifest.shards import build_manifest
from batch_pipeline.core.money.compare import compare_backends, self_hosted
from batch_pipeline.core.pricing.cost import load_prices
from batch_pipeline.core.spec.job import SelfHostedCost
from batch_pipeline.core.spec.loading import load_spec
from batch_pipeline.core.store import Store

from ..helpers import REPO


def test_self_hosted_cost_and_break_even():
    cfg = SelfHostedCost(
        gpu_usd_per_hour=3.6,
        prefill_tokens_per_s=1000,
        decode_tokens_per_s=100,
        prefix_hit_share=0.5,
        utilisation=0.5,
        spot_loss=0.0,
    )
    out = self_hosted(input_tokens=2_000_000, output_tokens=100_000, items=1000, cfg=cfg, api_cost=1.0)
    busy_hours = (1_000_000 / 1000 + 100_000 / 100) / 3600  # prefill of the uncached half + decode
    assert out["cost_usd"] == pytest.approx(busy_hours * 3.6 / 0.5, rel=1e-4)
    assert out["cost_per_million_items_usd"] == pytest.approx(out["cost_usd"] / 1000 * 1e6, rel=1e-3)
    at_break_even = self_hosted(
        2_000_000, 100_000, 1000, cfg.model_copy(update={"utilisation": out["break_even_utilisation"]}), api_cost=1.0
    )
    assert at_break_even["cost_usd"] == pytest.approx(1.0, rel=1e-3)  # there it costs what the API costs
    lossy = self_hosted(2_000_000, 100_000, 1000, cfg.model_copy(update={"spot_loss": 0.5}), api_cost=1.0)
    assert lossy["cost_usd"] == pytest.approx(2 * out["cost_usd"], rel=1e-4)


def test_demo_backends_side_by_side(tmp_path):
    spec = load_spec(REPO / "data" / "jobs" / "demo.yaml")
    store = Store(tmp_path)
    build_manifest(spec, store)
    rows = compare_backends(spec, store, load_prices(REPO / "data" / "prices.yaml"), spec.cost_compare)
    by = {r["backend"]: r for r in rows}
    assert list(by) == ["openai_batch", "online", "anthropic_batch", "self_hosted"]
    # the batch discount halves the interactive price of the same model
    assert by["online"]["cost_expected_usd"] == pytest.approx(2 * by["openai_batch"]["cost_expected_usd"], rel=0.01)
    assert all(r["requests"] == by["openai_batch"]["requests"] > 1900 for r in rows)
    assert 0 < by["self_hosted"]["break_even_utilisation"] < 1


def test_every_priced_backend_is_quoted_side_by_side_with_its_tokenizer_and_checked_date(tmp_path):
    spec = load_spec(REPO / "data" / "jobs" / "demo.yaml")
    store = Store(tmp_path)
    build_manifest(spec, store)
    prices = load_prices(REPO / "data" / "prices.yaml")
    rows = compare_backends(spec, store, prices, spec.cost_compare, every_priced=True)
    pairs = [(r["backend"], r["model"]) for r in rows if r["backend"] != "self_hosted"]
    assert len(pairs) == len(set(pairs))  # the configured ones are not repeated
    expected = {(b, m) for b, models in prices.prices.items() if b != "vllm" for m in models}
    assert set(pairs) == expected
    by = {(r["backend"], r["model"]): r for r in rows}
    assert {b for b, _ in pairs} >= {"gemini_batch", "vertex_batch", "bedrock_batch", "azure_openai_batch"}
    assert by[("openai_batch", "gpt-4o-mini")]["tokenizer"] == "o200k_base"
    assert by[("bedrock_batch", "meta.llama3-1-8b-instruct-v1:0")]["tokenizer"] == "cl100k_base"
    assert by[("gemini_batch", "gemini-2.5-flash")]["tokenizer"].startswith("gemini")
    assert by[("bedrock_batch", "us.anthropic.claude-sonnet-4-5-v1:0")]["tokenizer"].startswith("claude")
    assert all(r["checked"] is not None for r in rows if r["backend"] != "self_hosted")
    # the same model on Azure and OpenAI Batch costs the same; Gemini Pro costs more than Flash
    assert (
        by[("azure_openai_batch", "gpt-4o-mini")]["cost_expected_usd"]
        == by[("openai_batch", "gpt-4o-mini")]["cost_expected_usd"]
    )
    assert (
        by[("gemini_batch", "gemini-2.5-pro")]["cost_expected_usd"]
        > by[("gemini_batch", "gemini-2.5-flash")]["cost_expected_usd"]
    )
    assert rows[-1]["backend"] == "self_hosted"
