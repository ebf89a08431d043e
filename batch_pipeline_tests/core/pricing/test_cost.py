"""Cost truth: one formula, Anthropic cache writes at their real rate, and old result parts still readable."""

import json

import pyarrow as pa
import pytest
import yaml

from batch_pipeline.core.errors import ConfigError
from batch_pipeline.core.ledger.executor import RequestPlan, ShardWork
from batch_pipeline.core.ledger.result_parts import RESULT_SCHEMA, read_results, write_results
from batch_pipeline.core.money.pass_cost import cache_scenarios
from batch_pipeline.core.pricing.cost import Price, load_prices
from batch_pipeline.core.run.results import build_results
from batch_pipeline.core.spec.loading import parse_spec
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline.executors.anthropic.format import parse_results_block

from ..helpers import REPO

PRICES = load_prices(REPO / "data" / "prices.yaml")
HAIKU = PRICES.lookup("anthropic_batch", "claude-haiku-4-5")  # $1 in, $0.10 cache hit, $5 out, 50% off in batch

SPEC = parse_spec("""
name: anth
input: {path: in.jsonl, text_field: body}
prompt: {version: v1, system: "Label the ticket.", template: "{body}"}
model: claude-haiku-4-5
backend: {name: anthropic_batch, settings: {sandbox: true}}
sampling: {max_tokens: 16}
output: {choice: [billing, bug, other]}
""")


def line(custom_id: str, uncached: int, writes: int, reads: int, output: int) -> dict:
    """A succeeded Anthropic result line; Anthropic's ``input_tokens`` excludes cache writes and reads."""
    return {
        "custom_id": custom_id,
        "result": {
            "type": "succeeded",
            "message": {
                "id": f"msg_{custom_id}",
                "type": "message",
                "role": "assistant",
                "model": "claude-haiku-4-5",
                "content": [{"type": "tool_use", "id": "t", "name": "answer", "input": {"label": "bug"}}],
                "stop_reason": "tool_use",
                "stop_sequence": None,
                "usage": {
                    "input_tokens": uncached,
                    "output_tokens": output,
                    "cache_creation_input_tokens": writes,
                    "cache_read_input_tokens": reads,
                    "service_tier": "batch",
                    "cache_creation": {"ephemeral_5m_input_tokens": writes, "ephemeral_1h_input_tokens": 0},
                },
            },
        },
    }


def work(ids: list[str]) -> ShardWork:
    return ShardWork(
        "anth",
        "s00001",
        1,
        "anth:s00001:1",
        RequestPlan.from_spec(SPEC),
        pa.table({"request_id": ids, "user_prompt": ["x"] * len(ids)}),
    )


def test_the_published_anthropic_rates_are_in_the_price_table():
    for model, rate in [("claude-haiku-4-5", 1.00), ("claude-sonnet-4-5", 3.00)]:
        price = PRICES.lookup("anthropic_batch", model)
        assert (price.input_per_mtok, price.cached_input_per_mtok) == (rate, rate / 10)
        assert price.cache_ttl == "5m" and price.cache_write_multiplier == 1.25 and price.batch_discount == 0.5
        assert price.writes_cache
    one_hour = HAIKU.model_dump(exclude={"cache_write_multiplier"}) | {"cache_ttl": "1h"}
    assert Price(**one_hour).cache_write_multiplier == 2.0  # the 1-hour TTL's published multiplier by default
    assert not PRICES.lookup("openai_batch", "gpt-4o-mini").writes_cache  # automatic caching: writes are free


def test_an_anthropic_result_with_cache_write_read_and_uncached_input_costs_what_anthropic_bills():
    # 300 uncached, 2,000 written to the cache, 5,000 read from it, 40 out, on the batch API (half price):
    #   5-minute TTL: (300 x 1.00 + 2,000 x 1.00 x 1.25 + 5,000 x 0.10 + 40 x 5.00) / 1e6 x 0.5
    #               = (300 + 2,500 + 500 + 200) / 1e6 x 0.5 = $0.00175
    #   1-hour TTL:   (300 + 2,000 x 2.00 + 500 + 200) / 1e6 x 0.5 = 5,000 / 1e6 x 0.5 = $0.0025
    #   (writes at the plain input rate, as before: (2,300 + 500 + 200) / 1e6 x 0.5 = $0.0015)
    five_min, one_hour = 0.00175, 0.0025
    assert HAIKU.cost(7300, 40, cached_tokens=5000, cache_write_tokens=2000) == pytest.approx(five_min, rel=1e-12)
    hour = Price(**HAIKU.model_dump() | {"cache_ttl": "1h", "cache_write_multiplier": 2.0})
    assert hour.cost(7300, 40, cached_tokens=5000, cache_write_tokens=2000) == pytest.approx(one_hour, rel=1e-12)
    assert HAIKU.cost(7300, 40, cached_tokens=5000) == pytest.approx(0.0015, rel=1e-12)  # no writes: input rate

    # the same usage through the results parser and the result builder: the stored rows carry all three parts
    raw = parse_results_block(
        (json.dumps(line("a", 300, 2000, 5000, 40)) + "\n" + json.dumps(line("b", 300, 0, 0, 40)) + "\n").encode()
    )
    for price, expected in [(HAIKU, five_min), (hour, one_hour)]:
        table = build_results(
            raw,
            work(["a", "b"]),
            backend="anthropic_batch",
            pricing="batch",
            prompt_version="v1",
            price=price,
            provider_batch_id="msgbatch_1",
        )
        rows = {r["request_id"]: r for r in table.to_pylist()}
        a = rows["a"]
        assert (a["input_tokens"], a["cached_tokens"], a["cache_write_tokens"], a["output_tokens"]) == (
            7300,
            5000,
            2000,
            40,
        )
        assert a["status"] == "succeeded" and a["cost_usd"] == pytest.approx(expected, rel=1e-12)
        assert rows["b"]["cost_usd"] == pytest.approx((300 * 1.00 + 40 * 5.00) / 1e6 * 0.5, rel=1e-12)
    online = build_results(
        raw,
        work(["a", "b"]),
        backend="anthropic_batch",
        pricing="online",
        prompt_version="v1",
        price=HAIKU,
        provider_batch_id=None,
    )
    assert online.column("cost_usd")[0].as_py() == pytest.approx(2 * five_min, rel=1e-12)  # no batch discount


def test_a_backend_without_cache_writes_is_priced_as_before():
    """Raw rows with no cache_write_tokens column (OpenAI, vLLM, online) price all non-cached input at the
    input rate, exactly the formula of before."""
    raw = parse_results_block((json.dumps(line("a", 300, 2000, 5000, 40)) + "\n").encode())
    raw = raw.drop_columns(["cache_write_tokens"])  # e.g. an OpenAI row: 7,300 in, 5,000 cached
    price = PRICES.lookup("openai_batch", "gpt-4o-mini")
    table = build_results(
        raw,
        work(["a"]),
        backend="openai_batch",
        pricing="batch",
        prompt_version="v1",
        price=price,
        provider_batch_id="b",
    )
    assert table.column("cache_write_tokens").to_pylist() == [0]
    assert table.column("cost_usd")[0].as_py() == pytest.approx(
        (2300 * 0.15 + 5000 * 0.075 + 40 * 0.60) / 1e6 * 0.5, rel=1e-12
    )


def test_result_parts_written_before_cache_writes_existed_read_as_zero_writes(tmp_path):
    store = Store(tmp_path)
    raw = parse_results_block((json.dumps(line("new", 300, 2000, 5000, 40)) + "\n").encode())
    new = build_results(
        raw,
        work(["new"]),
        backend="anthropic_batch",
        pricing="batch",
        prompt_version="v1",
        price=HAIKU,
        provider_batch_id="b",
    )
    old_raw = parse_results_block((json.dumps(line("old", 300, 0, 5000, 40)) + "\n").encode())
    old = build_results(
        old_raw,
        work(["old"]),
        backend="anthropic_batch",
        pricing="batch",
        prompt_version="v1",
        price=HAIKU,
        provider_batch_id="b",
    ).drop_columns(["cache_write_tokens"])
    old_part = JobPaths("anth").result_part("s00001", 1, 1, "old00000")
    store.write_table(old_part, old)  # a part of the schema before this column
    write_results(store, "anth", "s00001", 2, 1, new)

    def check(frame, cols):
        assert frame.columns == cols
        by = {r["request_id"]: r for r in frame.to_dicts()}
        assert by["old"]["cache_write_tokens"] == 0 and by["new"]["cache_write_tokens"] == 2000
        assert by["old"]["cost_usd"] == pytest.approx(old.column("cost_usd")[0].as_py())

    check(read_results(store, "anth"), RESULT_SCHEMA.names)  # one scan
    check(
        read_results(store, "anth", columns=["cache_write_tokens", "cost_usd"]),
        ["request_id", "attempt", "cache_write_tokens", "cost_usd"],
    )
    # only old parts: the column is still there, as 0
    only_old = read_results(store, "anth", shard_id="s00001", columns=["cache_write_tokens"])
    assert only_old.height == 2
    # part by part (a torn part defeats the one scan): the old part is not dropped as torn for lacking a column
    store.write_bytes(JobPaths("anth").result_part("s00001", 3, 1, "torn0000"), b"PAR1 not really")
    check(
        read_results(store, "anth", columns=["cache_write_tokens", "cost_usd"]),
        ["request_id", "attempt", "cache_write_tokens", "cost_usd"],
    )
    check(read_results(store, "anth"), RESULT_SCHEMA.names)
    store.write_table(JobPaths("anth").result_part("s00002", 1, 1, "old00001"), old)
    assert read_results(store, "anth", shard_id="s00002", columns=["cache_write_tokens"])[
        "cache_write_tokens"
    ].to_list() == [0]  # every part predates the column


def test_cache_scenarios_write_the_prefix_once_per_batch_at_best_and_on_every_request_at_worst():
    # a prefix of 60% of the input; the first request of each batch writes 6% of the input
    billed = cache_scenarios(0.6, 0.06, writes_billed=True, measured=None)
    assert billed["high"] == pytest.approx((0.54, 0.06))  # best case: one write per batch, every other reads
    assert billed["expected"] == pytest.approx((0.3, 0.3))  # half read; a miss writes
    assert billed["low"] == pytest.approx((0.0, 0.6))  # worst case: every request writes its prefix
    free = cache_scenarios(0.6, 0.06, writes_billed=False, measured=None)
    assert free == {"low": (0.0, 0.0), "expected": (0.3, 0.0), "high": (0.6, 0.0)}  # OpenAI: as before
    measured = cache_scenarios(0.6, 0.06, writes_billed=True, measured=(0.5, 0.08))
    assert measured["expected"] == (0.5, 0.08) and measured["low"] == pytest.approx((0.0, 0.6))
    # the high end of the range holds: writing everything costs more than reading nothing
    tokens, out = 1_000_000, 0
    cost = {
        k: HAIKU.cost(tokens, out, cached_tokens=tokens * r, cache_write_tokens=tokens * w)
        for k, (r, w) in billed.items()
    }
    assert cost["high"] < cost["expected"] < HAIKU.cost(tokens, out) < cost["low"]


def test_the_price_table_is_parsed_once_per_version_of_the_file(tmp_path):
    """Every shard step asks for the table: an unchanged file is the same parsed table, an edited one is read again,
    and a broken one is a ConfigError naming the file (never a cached earlier version)."""
    path = tmp_path / "prices.yaml"
    path.write_text((REPO / "data" / "prices.yaml").read_text())
    first = load_prices(path)
    assert load_prices(path) is first and load_prices(str(path)) is first
    before = first.lookup("openai_batch", "gpt-4o-mini")
    table = yaml.safe_load(path.read_text())
    table["prices"]["openai_batch"]["gpt-4o-mini"]["input_per_mtok"] = before.input_per_mtok * 3
    path.write_text(yaml.safe_dump(table))
    edited = load_prices(path)
    assert edited is not first
    assert edited.lookup("openai_batch", "gpt-4o-mini").input_per_mtok == before.input_per_mtok * 3
    path.write_text("prices: {openai_batch: [unclosed\n")
    with pytest.raises(ConfigError, match=r"prices\.yaml: the price table is not valid YAML"):
        load_prices(path)
    path.unlink()
    with pytest.raises(ConfigError, match=r"prices\.yaml: cannot read price table"):
        load_prices(path)
