"""The budget guard prices what every open attempt sent before each submission; what an attempt sent is read once
per guard (its intent is written once, a shard's items never change), and a shard's attempt records are parsed
again only when one of its record files appeared or changed. The cached figure must be the one read fresh, a new
attempt must still be priced, and a closed one must drop out."""

import polars as pl
import pytest

from batch_pipeline.core.ledger.attempts import AttemptLog
from batch_pipeline.core.manifest.shards import Manifest, build_manifest
from batch_pipeline.core.money.budget import BudgetGuard
from batch_pipeline.core.money.pending import est_total
from batch_pipeline.core.pricing.cost import load_prices
from batch_pipeline.core.store import Store
from batch_pipeline_tests.core.helpers import REPO, base_spec_dict, write_jsonl, write_spec

PRICES = load_prices(REPO / "data" / "prices.yaml")


@pytest.fixture
def job(tmp_path):
    rows = [{"id": f"k{i}", "body": f"ticket {i}: " + "charged twice " * (i % 7 + 1)} for i in range(40)]
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    spec = write_spec(
        tmp_path / "job", base_spec_dict(str(path), model="gpt-4o-mini", shards={"max_requests": 8}, budget_usd=5)
    )
    store = Store(tmp_path / "home")
    build_manifest(spec, store)
    return spec, store


def _submit(spec, store, shard: str, number: int, ids: list[str]) -> None:
    log = AttemptLog(store, spec.name, shard)
    key = f"{spec.name}:{shard}:{number}"
    assert log.create_intent(number, {"key": key, "request_ids": ids, "backend": spec.backend.name})
    log.record(number, "submitted", {"backend": spec.backend.name, "batch_id": f"b-{shard}-{number}", "key": key})


def _fresh(guard: BudgetGuard, manifest: Manifest, sent: dict[str, list[str]]) -> float:
    total = 0.0
    for shard, ids in sent.items():
        items = pl.from_arrow(manifest.shard_items(shard, ["request_id", "est_input_tokens"]))
        assert isinstance(items, pl.DataFrame)
        part = items.filter(pl.col("request_id").is_in(ids))
        total += guard.request_cost_high(float(est_total(part)), part.height)
    return total


def test_in_flight_reads_each_attempt_once_and_matches_a_fresh_read(job, monkeypatch):
    spec, store = job
    manifest = Manifest(spec.name, store)
    shards = manifest.shard_ids()[:3]
    ids = {s: manifest.shard_items(s, ["request_id"]).column("request_id").to_pylist() for s in shards}
    sent = {shards[0]: ids[shards[0]], shards[1]: ids[shards[1]][::2]}  # a whole shard, part of another
    for shard, rids in sent.items():
        _submit(spec, store, shard, 1, rids)
    guard = BudgetGuard(spec, store, PRICES.lookup(spec.backend.name, spec.model))
    reads: list[str] = []
    shard_items = guard.manifest.shard_items
    monkeypatch.setattr(guard.manifest, "shard_items", lambda s, *a, **k: reads.append(s) or shard_items(s, *a, **k))

    parsed: list[str] = []
    log_all = AttemptLog.all
    monkeypatch.setattr(AttemptLog, "all", lambda self: parsed.append(self.shard_id) or log_all(self))

    first = guard._in_flight()
    assert first == pytest.approx(_fresh(guard, manifest, sent)) and first > 0
    assert sorted(reads) == sorted(sent) and len(parsed) == len(manifest.shard_ids())
    parsed.clear()
    assert guard._in_flight() == first and len(reads) == len(sent) and parsed == []  # again: nothing re-read

    _submit(spec, store, shards[2], 1, ids[shards[2]][:3])  # a new attempt is priced
    sent[shards[2]] = ids[shards[2]][:3]
    assert guard._in_flight() == pytest.approx(_fresh(guard, manifest, sent)) and parsed == [shards[2]]

    AttemptLog(store, spec.name, shards[0]).record(1, "collected", {"state": "completed"})  # a closed one drops out
    del sent[shards[0]]
    assert guard._in_flight() == pytest.approx(_fresh(guard, manifest, sent))
