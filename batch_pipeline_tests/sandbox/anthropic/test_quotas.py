"""Anthropic's processing-queue quota and result retention through the real ``anthropic`` SDK over HTTP: a create
whose requests would pass ``quota_enqueued_requests`` is a 429 ``rate_limit_error`` with ``retry-after`` (exactly
past the cap, not at it), per key, freed when a batch ends, never billed; results are gone
``retention_anthropic_s`` after the batch was created."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import pytest

from batch_pipeline.sandbox import SandboxAdmin

from ..support import assert_never_over, load_events
from .test_api import MODEL, create, request, results, retrieve, wait_ended

BATCH = [request(f"q{i}", f"Label ticket {i}.") for i in range(5)]


def sdk(url: str, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key=key, max_retries=0, timeout=20)


@pytest.fixture
def keys(sandbox_url: str, admin: SandboxAdmin) -> Iterator[tuple[anthropic.Anthropic, anthropic.Anthropic]]:
    one, two = sdk(sandbox_url, "sk-ant-one"), sdk(sandbox_url, "sk-ant-two")
    yield one, two
    one.close()
    two.close()


def refused(client: anthropic.Anthropic) -> anthropic.RateLimitError:
    with pytest.raises(anthropic.RateLimitError) as caught:
        create(client, BATCH)
    return caught.value


def test_a_create_past_the_queue_cap_is_a_429_and_one_at_the_cap_is_accepted(keys, admin):
    client = keys[0]
    cap = 2 * len(BATCH) - 1
    admin.set_scenario("normal", quota_enqueued_requests=cap, in_progress_s=10.0)
    admin.clock(freeze=True)
    first = create(client, BATCH)
    error = refused(client)
    assert error.status_code == 429
    assert (
        error.body
        == {"type": "error", "error": {"type": "rate_limit_error", "message": error.body["error"]["message"]}}
        and f"Limit: {cap} requests in the processing queue" in error.body["error"]["message"]
    )
    assert 1 <= int(error.response.headers["retry-after"]) <= 60
    admin.set_scenario("normal", quota_enqueued_requests=2 * len(BATCH), in_progress_s=10.0)
    second = create(client, BATCH)  # exactly the cap
    assert [b["processing_status"] for b in (first, second)] == ["in_progress", "in_progress"]
    admin.clock(advance_s=11.0)
    assert {wait_ended(client, b["id"])["request_counts"]["succeeded"] for b in (first, second)} == {len(BATCH)}
    ledger = admin.ledger()
    assert len(ledger) == 2 * len(BATCH) and {e["batch_id"] for e in ledger} == {first["id"], second["id"]}
    load = admin.load()
    assert assert_never_over(load, "anthropic", "requests", 2 * len(BATCH)) == 2 * len(BATCH)
    assert load["refusals"] == 1 and [e["event"] for e in load_events(load, "anthropic")] == [
        "enqueue",
        "refuse",
        "enqueue",
        "release",
        "release",
    ]
    assert {(e["account"], e["model"]) for e in load["events"]} == {("sk-ant-one", MODEL)}


def test_the_queue_frees_when_a_batch_ends_and_each_key_has_its_own(keys, admin):
    one, two = keys
    admin.set_scenario("normal", quota_enqueued_requests=len(BATCH), in_progress_s=10.0)
    admin.clock(freeze=True)
    held = create(one, BATCH)
    create(two, BATCH)  # another account's queue
    error = refused(one)
    assert int(error.response.headers["retry-after"]) == 11  # when the held batch ends: 0.05 + 10 + 0.05 s, rounded up
    admin.clock(advance_s=11.0)
    assert wait_ended(one, held["id"])["processing_status"] == "ended"
    later = create(one, BATCH)
    assert retrieve(one, later["id"])["processing_status"] == "in_progress"
    load = admin.load()
    for account in ("sk-ant-one", "sk-ant-two"):
        assert max(e["requests"] for e in load["events"] if e["account"] == account) == len(BATCH)
    assert [e["event"] for e in load["events"] if e["account"] == "sk-ant-one"] == [
        "enqueue",
        "refuse",
        "release",
        "enqueue",
    ]


def test_a_mixed_model_batch_counts_per_model_against_one_queue(keys, admin):
    client = keys[0]
    mixed = BATCH[:2] + [request("h1", "x", model="claude-haiku-4-5"), request("h2", "y", model="claude-haiku-4-5")]
    admin.set_scenario("normal", quota_enqueued_requests=5, in_progress_s=10.0)
    admin.clock(freeze=True)
    create(client, mixed)
    with pytest.raises(anthropic.RateLimitError):
        create(client, BATCH[:2])  # 4 waiting + 2 > 5, whatever the models
    create(client, BATCH[:1])
    peaks = {p["model"]: p["requests"] for p in admin.load()["peak"]}
    assert peaks == {MODEL: 3, "claude-haiku-4-5": 2}


def test_results_are_gone_after_retention_from_creation_and_not_before(keys, admin):
    client = keys[0]
    admin.clock(freeze=True)  # every age below is on the sandbox clock, however long the machine takes to answer
    created = create(client, BATCH)
    admin.clock(advance_s=1.0)  # past its 0.3 s lifecycle
    ended = wait_ended(client, created["id"])
    admin.clock(advance_s=29 * 24 * 3600 - 5 - 1.0)  # 5 s before the retention from creation ends
    assert len(results(client, ended["id"])) == len(BATCH) and retrieve(client, ended["id"])["archived_at"] is None
    admin.clock(advance_s=10.0)
    with pytest.raises(anthropic.NotFoundError) as gone:
        results(client, ended["id"])
    assert gone.value.status_code == 404 and gone.value.body["error"]["type"] == "not_found_error"
    assert retrieve(client, ended["id"])["archived_at"] is not None
    admin.set_scenario("normal", retention_anthropic_s=60)
    short = create(client, BATCH[:1])
    admin.clock(advance_s=1.0)
    assert len(results(client, short["id"])) == 1
    admin.clock(advance_s=60.0)
    with pytest.raises(anthropic.NotFoundError):
        results(client, short["id"])
