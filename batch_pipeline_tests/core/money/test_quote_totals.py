"""The quote from the manifest's per-shard totals is the quote item by item, field for field.

A job of 100 items in shards of at most 8: one done (every item answered), one part done (answers, a poison item dead at once, server
errors left to retry, an item never answered), one with only server errors, the rest untouched. Quoted three ways:
``store_quote`` (the results and the states of the shards with results, the pending work from the stored
totals), ``make_quote`` on ``JobState``'s whole frames (what the CLI and the quote asset pass), and the per-item
path on the manifest's index. Every field but the timestamps must agree; so must a manifest written before the
totals were stored (its generation record without them, as version 1).
"""

import json

import polars as pl
import pytest

from batch_pipeline.core.ledger.executor import RequestPlan, ShardWork, raw_table
from batch_pipeline.core.ledger.reconcile import DEAD, VALID
from batch_pipeline.core.ledger.result_parts import read_results, write_results
from batch_pipeline.core.manifest.generation import GENERATION_VERSION
from batch_pipeline.core.manifest.shards import Manifest, build_manifest
from batch_pipeline.core.money.budget import BudgetGuard
from batch_pipeline.core.money.job_quote import make_quote, quote_inputs, store_quote
from batch_pipeline.core.money.pending import PendingWork, est_total
from batch_pipeline.core.money.quote import calibration, schema_tokens
from batch_pipeline.core.money.quote_record import Quote
from batch_pipeline.core.pricing.cost import load_prices
from batch_pipeline.core.publish.tables import JobState
from batch_pipeline.core.run.results import build_results
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline_tests.core.helpers import REPO, base_spec_dict, write_jsonl, write_spec

PRICES = load_prices(REPO / "data" / "prices.yaml")
MODELS = {  # automatic caching; billed cache writes (the first-write batches count the pending shards); a fallback
    "openai": ({"name": "openai_batch"}, "gpt-4o-mini", None),
    "anthropic": ({"name": "anthropic_batch"}, "claude-haiku-4-5", None),
    "fallback": ({"name": "openai_batch"}, "gpt-4o-mini", {"model": "gpt-4o"}),
}


def _answer(rid: str, label: str | None, status: int = 200, code: str | None = None) -> tuple:
    text = json.dumps({"label": label}) if label else None
    tokens = 40 + int(rid[:2], 16) % 17  # measured usage that differs from item to item
    return (rid, status, text, "stop" if status == 200 else None, tokens, 5, 8, code, None, f"r_{rid}", "{}")


def _write(spec, store, sid: str, attempt: int, lines: list[tuple]) -> None:
    work = ShardWork(
        spec.name, sid, attempt, f"{spec.name}:{sid}:{attempt}", RequestPlan.from_spec(spec), raw_table(lines)
    )
    price = PRICES.lookup(spec.backend.name, spec.model)
    table = build_results(
        raw_table(lines),
        work,
        backend=spec.backend.name,
        pricing="batch",
        prompt_version="v1",
        price=price,
        provider_batch_id=f"b-{sid}-{attempt}",
    )
    write_results(store, spec.name, sid, attempt, 1, table)


@pytest.fixture(params=sorted(MODELS))
def job(request, tmp_path):
    backend, model, fallback = MODELS[request.param]
    rows = [
        {"id": f"k{i}", "body": f"ticket {i}: " + "the invoice was charged twice " * (i % 9 + 1)} for i in range(100)
    ]
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    spec = write_spec(
        tmp_path / "job",
        base_spec_dict(
            str(path),
            backend=backend,
            model=model,
            shards={"max_requests": 8},
            retries={"per_item": 2},
            budget_usd=5,
            **({"fallback": fallback} if fallback else {}),
        ),
    )
    store = Store(tmp_path / "store")
    build_manifest(spec, store)
    manifest = Manifest(spec.name, store)
    shards = manifest.shard_ids()
    assert len(shards) > 4
    ids = {s: manifest.shard_items(s, ["request_id"]).column("request_id").to_pylist() for s in shards[:3]}
    _write(spec, store, shards[0], 1, [_answer(r, "bug") for r in ids[shards[0]]])  # all done
    part = ids[shards[1]]
    first = [_answer(r, "bug") if i % 3 else _answer(r, None, 500, "server_error") for i, r in enumerate(part[:-1])]
    first[1] = _answer(part[1], None, 400, "context_length_exceeded")  # poison: dead at once
    _write(spec, store, shards[1], 1, first)  # the last item never answered
    _write(spec, store, shards[1], 2, [_answer(r, "other") for r in part[:-1:3]])
    _write(spec, store, shards[2], 1, [_answer(r, None, 500, "server_error") for r in ids[shards[2]]])
    return spec, store


def _fields(quote: Quote) -> dict:
    out = quote.as_json()
    del out["created_at"], out["expires_at"]
    return out


def _whole_frames(spec, store) -> Quote:
    state = JobState.load(spec, store)
    return make_quote(spec, store, PRICES, state.quote_basis())


def test_the_generation_stores_each_shards_items_and_token_sum(job):
    spec, store = job
    manifest = Manifest(spec.name, store)
    record = manifest.latest()
    assert record is not None and record.version == GENERATION_VERSION == 2 and record.shard_totals is not None
    index = pl.from_arrow(manifest.item_index(["shard_id", "est_input_tokens"]))
    by_shard = (
        index.group_by("shard_id").agg(pl.len(), pl.col("est_input_tokens").cast(pl.Int64).sum()).sort("shard_id")
    )
    assert manifest.shard_totals() == {s: (n, e) for s, n, e in by_shard.iter_rows()}
    assert sum(record.shard_totals.est_input_tokens) == record.est_input_tokens_new


def test_the_quote_from_the_totals_is_the_quote_item_by_item(job):
    spec, store = job
    quote = store_quote(spec, store, PRICES)
    assert _fields(quote) == _fields(_whole_frames(spec, store))
    index = pl.from_arrow(Manifest(spec.name, store).item_index(["request_id", "shard_id", "est_input_tokens"]))
    assert isinstance(index, pl.DataFrame)
    per_item = make_quote(spec, store, PRICES, quote_inputs(spec, store).pricing(index))
    assert _fields(per_item) == _fields(quote)
    # the figures themselves: what is pending, and its tokens as the tokenizer's model scales the estimates
    full = JobState.load(spec, store).states
    pending = index.join(full.filter(pl.col("state").is_in([VALID, DEAD])), on="request_id", how="anti")
    manifest = Manifest(spec.name, store)
    first, second = (manifest.shard_items(s, ["request_id"]).num_rows for s in manifest.shard_ids()[:2])
    # the first shard, and all of the second but its item never answered (its poison item dead, the rest valid)
    assert quote.pending_requests == pending.height == 100 - first - (second - 1)
    expected = quote.tokenizer.tokens(float(est_total(pending)), pending.height) * quote.calibration.tokenizer_factor
    assert quote.passes.first.input_tokens == round(expected)
    assert quote.calibration.items_measured > 0 and quote.spent_usd > 0
    assert (quote.passes.fallback is not None) == (spec.fallback is not None)


def test_nothing_done_and_all_done_quote_alike_both_ways(job, tmp_path):
    spec, store = job
    fresh = Store(tmp_path / "fresh")
    build_manifest(spec, fresh)
    assert _fields(store_quote(spec, fresh, PRICES)) == _fields(_whole_frames(spec, fresh))
    assert store_quote(spec, fresh, PRICES).pending_requests == 100
    manifest = Manifest(spec.name, fresh)
    for sid in manifest.shard_ids():
        ids = manifest.shard_items(sid, ["request_id"]).column("request_id").to_pylist()
        _write(spec, fresh, sid, 1, [_answer(r, "bug") for r in ids])
    done = store_quote(spec, fresh, PRICES)
    assert done.pending_requests == 0 and _fields(done) == _fields(_whole_frames(spec, fresh))


def test_a_manifest_built_before_the_totals_were_stored_still_quotes_the_same(job):
    spec, store = job
    before = _fields(store_quote(spec, store, PRICES))
    paths = JobPaths(spec.name)
    for rel in store.list_files(paths.generations, suffix=".json"):
        record = store.read_json(rel)
        del record["shard_totals"], record["version"]  # as a version-1 record was written
        store.write_json(rel, record)
    manifest = Manifest(spec.name, store)
    assert [g.version for g in manifest.generations()] == [1] and manifest.latest().shard_totals is None
    assert _fields(store_quote(spec, store, PRICES)) == before  # the totals computed from the shard files


def test_the_budget_guard_calibrates_on_the_shards_with_results_as_on_every_item(job):
    spec, store = job
    price = PRICES.lookup(spec.backend.name, spec.model)
    guard = BudgetGuard(spec, store, price)
    guard._calibrate()
    items = pl.from_arrow(Manifest(spec.name, store).item_index(["request_id", "est_input_tokens"]))
    results = read_results(store, spec.name, columns=["input_tokens"])
    factor, measured = calibration(items, results, schema_tokens(spec))
    assert measured > 0 and guard.factor == factor


def test_token_sums_do_not_wrap_past_32_bits(tmp_path):
    """The manifest's est_input_tokens is a 32-bit column; a large job's sum is past 2**31."""
    items = pl.DataFrame(
        {"request_id": ["a", "b", "c"], "shard_id": ["s1", "s1", "s2"], "est_input_tokens": [2**30] * 3},
        schema_overrides={"est_input_tokens": pl.Int32},
    )
    work = PendingWork.from_items(Manifest("t", Store(tmp_path)), items, None)
    assert work.est_sum == 3 * 2**30 and work.items_est == 3 * 2**30 and work.pending_by_shard == {"s1": 2, "s2": 1}
