"""Pricing a pass that has no manifest yet: the upstream's rows times the share, at the pass's own price."""

import polars as pl
import pytest

from batch_pipeline.core.money.estimate import schema_text
from batch_pipeline.core.money.passes import cascade_quote, price_pass
from batch_pipeline.core.pricing.cost import BYTES_PER_TOKEN, fixed_request_tokens, load_prices
from batch_pipeline.core.store import Store
from batch_pipeline_tests.core.helpers import REPO, base_spec_dict, write_spec

PRICES = load_prices(REPO / "data" / "prices.yaml")


def specs(tmp_path):
    up = write_spec(
        tmp_path / "jobs", base_spec_dict(str(tmp_path / "in.jsonl"), name="up", model="gpt-4o-mini"), "up.yaml"
    )
    down = base_spec_dict(
        "",
        name="down",
        model="gpt-4o",
        sampling={"temperature": 0, "max_tokens": 100},
        prompt={"version": "d1", "system": "Extract.", "template": "{output}: {body}"},
        output={"json_schema": {"type": "object", "properties": {"topic": {"type": "string"}}}},
    )
    down["input"] = {"from_job": "up", "text_field": "body", "where": "output = 'other'", "assumed_share": 0.4}
    return up, write_spec(tmp_path / "jobs", down, "down.yaml")


def test_price_pass_counts_rows_prefix_and_answers_at_the_pass_price(tmp_path):
    _, down = specs(tmp_path)
    expected, high = price_pass(down, PRICES, 10, user_tokens=50)
    price = PRICES.lookup("openai_batch", "gpt-4o")
    per_request = 50 + fixed_request_tokens(len(b"Extract.")) + (len(": ") + len(schema_text(down))) / BYTES_PER_TOKEN
    assert expected == pytest.approx(price.cost(10 * per_request, 10 * 100, batch=True))
    assert high > expected


def test_the_first_pass_quote_prices_the_next_pass_at_the_assumed_share(tmp_path):
    up, down = specs(tmp_path)
    items = pl.DataFrame({"request_id": [str(i) for i in range(20)], "est_input_tokens": [80] * 20})
    cascade = cascade_quote(
        up, Store(tmp_path / "home"), PRICES, items, {"requests": 20, "cost_expected": 0.01, "cost_high": 0.02}
    )
    first, second = cascade.passes
    assert (first.job, first.share_source, first.cost_expected) == ("up", "all", 0.01)
    assert (second.job, second.share, second.share_source, second.requests) == ("down", 0.4, "assumed", 8)
    user = 80 - fixed_request_tokens(len(up.prompt.system.encode()))
    assert second.cost_expected == pytest.approx(price_pass(down, PRICES, 8, user)[0], abs=1e-6)
    assert cascade.total.expected == pytest.approx(0.01 + second.cost_expected, abs=1e-6)
    assert (
        cascade_quote(
            write_spec(tmp_path / "solo", base_spec_dict("x", name="solo")),
            Store(tmp_path / "h2"),
            PRICES,
            items,
            {"requests": 20, "cost_expected": 0.0, "cost_high": 0.0},
        )
        is None
    )


def test_a_later_pass_counts_its_few_shot_examples_and_this_jobs_rows_less_theirs(tmp_path):
    up, down = specs(tmp_path)
    examples = [
        {"role": "user", "content": "Broken export after the update " * 8},
        {"role": "assistant", "content": "{}"},
    ]
    prompt = {**down.prompt.model_dump(), "examples": examples}
    shots = write_spec(
        tmp_path / "jobs",
        {**down.model_dump(mode="json", exclude_none=True, exclude={"source_path"}), "prompt": prompt},
        "down.yaml",
    )
    example_bytes = len("".join(t["content"] for t in examples).encode())
    plain, with_examples = price_pass(down, PRICES, 10, 50), price_pass(shots, PRICES, 10, 50)
    price = PRICES.lookup("openai_batch", "gpt-4o")
    extra = fixed_request_tokens(len(b"Extract.") + example_bytes) - fixed_request_tokens(len(b"Extract."))
    assert with_examples[0] - plain[0] == pytest.approx(price.cost(10 * extra, 0, batch=True))
    # this job's row content is its estimate less the prefix the manifest counted in it (examples included)
    up_shots = up.model_copy(update={"prompt": up.prompt.model_copy(update={"examples": shots.prompt.examples})})
    items = pl.DataFrame(
        {
            "request_id": ["a"],
            "est_input_tokens": [200 + fixed_request_tokens(len(up_shots.prompt.prefix_text.encode()))],
        }
    )
    cascade = cascade_quote(
        up_shots, Store(tmp_path / "home"), PRICES, items, {"requests": 1, "cost_expected": 0.0, "cost_high": 0.0}
    )
    assert cascade.passes[1].cost_expected == pytest.approx(price_pass(shots, PRICES, 0.4, 200)[0], abs=1e-9)
