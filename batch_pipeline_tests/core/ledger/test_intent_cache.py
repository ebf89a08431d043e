"""An intent is parsed once per file version: read again, the log hands back the same record; a changed file and a
torn one are read afresh; the cache holds at most its bound of request IDs. A reader that needs no request IDs gets
the intent's head, kept for every intent it has read, and an attempt read that way refuses to give IDs."""

import json
import os

import pytest

from batch_pipeline.core.ledger.attempts import INTENTS, AttemptLog, IntentCache, IntentHead, IntentRecord
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store

PATHS = JobPaths("j")


def _intent(ids: list[str]) -> dict:
    return {"key": "j:s00001:1", "request_ids": ids, "requests": len(ids), "backend": "openai_batch"}


def _log(tmp_path) -> tuple[Store, AttemptLog]:
    store = Store(str(tmp_path))
    return store, AttemptLog(store, "j", "s00001")


def test_a_second_read_of_an_unchanged_intent_is_the_record_already_parsed(tmp_path):
    store, log = _log(tmp_path)
    assert log.create_intent(1, _intent([f"{i:064x}" for i in range(1000)]))
    log.record(1, "submitted", {"backend": "openai_batch", "batch_id": "b1", "key": "j:s00001:1"})
    first, again = log.all(), AttemptLog(store, "j", "s00001").all()
    assert again[0].intent is first[0].intent
    assert again[0].submitted is not first[0].submitted  # small records are read each time
    assert len(again[0].request_ids) == 1000


def test_an_intent_file_that_changed_is_read_again(tmp_path):
    store, log = _log(tmp_path)
    log.create_intent(1, _intent(["a", "b"]))
    assert log.all()[0].request_ids == ["a", "b"]
    rel = PATHS.attempt_event("s00001", 1, "intent")
    path = store.local_path(rel)
    assert path is not None
    stat = path.stat()
    store.write_bytes(rel, json.dumps(_intent(["c", "d"])).encode())  # same size, written over by hand
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    assert log.all()[0].request_ids == ["c", "d"]
    store.write_bytes(rel, json.dumps(_intent(["e"])).encode())  # another size
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    assert log.all()[0].request_ids == ["e"]


def test_a_torn_intent_is_not_kept_and_reads_once_it_is_whole(tmp_path):
    store, log = _log(tmp_path)
    rel = PATHS.attempt_event("s00001", 1, "intent")
    whole = json.dumps(_intent(["a", "b"])).encode()
    store.write_bytes(rel, whole[: len(whole) // 2])
    assert log.all() == []
    store.write_bytes(rel, whole)
    assert log.all()[0].request_ids == ["a", "b"]


def test_the_cache_holds_at_most_its_bound_of_request_ids():
    cache = IntentCache(max_ids=5)
    records = {n: IntentRecord(key=f"k{n}", request_ids=[str(i) for i in range(n)]) for n in (2, 3, 4, 6)}
    cache.put(("a", 1, 1), records[2])
    cache.put(("b", 1, 1), records[3])
    assert cache.get(("a", 1, 1)) is records[2]  # read: now the most recent
    cache.put(("c", 1, 1), records[4])  # 2 + 3 + 4 > 5: the least recently read go first
    assert cache.get(("b", 1, 1)) is None and cache.get(("a", 1, 1)) is None
    assert cache.get(("c", 1, 1)) is records[4]
    cache.put(("d", 1, 1), records[6])  # larger than the whole bound: never kept
    assert cache.get(("d", 1, 1)) is None and cache.get(("c", 1, 1)) is records[4]


def test_a_reader_without_request_ids_gets_the_intents_head_parsed_once(tmp_path):
    store, log = _log(tmp_path)
    assert log.create_intent(1, {**_intent([f"{i:064x}" for i in range(500)]), "note": "a newer writer's key"})
    first = log.all(request_ids=False)[0]
    assert type(first.intent) is IntentHead
    assert (first.key, first.backend, first.intent.requests) == ("j:s00001:1", "openai_batch", 500)
    assert first.intent.model_extra == {"note": "a newer writer's key"}  # unknown keys kept, as in the record
    with pytest.raises(TypeError, match="without request IDs"):
        _ = first.request_ids
    # the whole records dropped (other shards' intents read since): the head is still kept, not parsed again
    INTENTS.put(("elsewhere", 1, 1), IntentRecord(key="k", request_ids=[str(i) for i in range(INTENTS.max_ids)]))
    assert AttemptLog(store, "j", "s00001").all(request_ids=False)[0].intent is first.intent
    whole = AttemptLog(store, "j", "s00001").all()[0]
    assert type(whole.intent) is IntentRecord and len(whole.request_ids) == 500
    assert whole.intent.head() == first.intent


def test_a_changed_intent_gives_a_new_head_and_a_torn_one_none(tmp_path):
    store, log = _log(tmp_path)
    rel = PATHS.attempt_event("s00001", 1, "intent")
    whole = json.dumps(_intent(["a", "b"])).encode()
    store.write_bytes(rel, whole[: len(whole) // 2])
    assert log.all(request_ids=False) == []
    store.write_bytes(rel, whole)
    assert log.all(request_ids=False)[0].intent.requests == 2
    path = store.local_path(rel)
    assert path is not None
    stat = path.stat()
    store.write_bytes(rel, json.dumps(_intent(["c"])).encode())
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    assert log.all(request_ids=False)[0].intent.requests == 1


def test_the_heads_are_bounded_too():
    cache = IntentCache(max_ids=0, max_heads=2)  # no whole record kept: heads only
    for name in ("a", "b", "c"):
        head = cache.put((name, 1, 1), IntentRecord(key=name, request_ids=["x"]))
        assert head == IntentHead(key=name, at=head.at)
    assert cache.get(("c", 1, 1)) is None
    assert cache.head(("a", 1, 1)) is None  # the least recently read out first
    assert cache.head(("b", 1, 1)) is not None and cache.head(("c", 1, 1)) is not None
