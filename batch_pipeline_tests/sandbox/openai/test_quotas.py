"""OpenAI and Azure account quotas and retention through the real ``openai`` SDK over HTTP: enqueued tokens per
(key, model) refused at the end of validation exactly past the cap, batch creates per rolling hour, separate keys,
the load freeing when a batch ends, the load ledger, nothing billed for a refused batch, output files deleted
``retention_openai_s`` after the batch ended."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from batch_pipeline.sandbox import SandboxAdmin

from ..support import (
    MODEL,
    assert_never_over,
    chat_line,
    load_events,
    poll,
    read_jsonl,
    retrieve,
    submit,
    to_jsonl,
    wait_for,
)

TEXT = "Summarise this support ticket about a delayed parcel, a double charge and a broken lid, politely. " * 3
LINES = [chat_line(f"r{i}", f"{TEXT} Ticket {i}.") for i in range(16)]  # about 1,200 prompt tokens in all
VALIDATING_S = 0.05  # the default: a frozen clock advanced past it ends every validation


def sdk(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=20)


@pytest.fixture
def keys(sandbox_url: str, admin: SandboxAdmin) -> Iterator[tuple[openai.OpenAI, openai.OpenAI]]:
    one, two = sdk(sandbox_url, "sk-one"), sdk(sandbox_url, "sk-two")
    yield one, two
    one.close()
    two.close()


def batch_tokens(client: openai.OpenAI, admin: SandboxAdmin) -> int:
    """The prompt tokens the sandbox bills for ``LINES`` (from a probe batch); the sandbox is reset after."""
    done = wait_for(client, submit(client, LINES)["id"])
    tokens = sum(e["input_tokens"] for e in admin.ledger() if e["batch_id"] == done["id"])
    assert tokens == done["usage"]["input_tokens"] > 1000
    admin.reset()
    return tokens


def end_validation(admin: SandboxAdmin) -> None:
    admin.clock(advance_s=VALIDATING_S + 0.01)


def test_enqueued_tokens_refuse_a_batch_exactly_past_the_cap_and_bill_it_nothing(keys, admin):
    client = keys[0]
    tokens = batch_tokens(client, admin)
    cap = 2 * tokens - 1  # one token short of two batches
    admin.set_scenario("normal", quota_enqueued_tokens=cap)
    admin.clock(freeze=True)
    first, second = submit(client, LINES), submit(client, LINES)
    assert second["status"] == "validating"  # the create is accepted; validation refuses it
    end_validation(admin)
    assert retrieve(client, first["id"])["status"] == "in_progress"
    refused = retrieve(client, second["id"])
    assert refused["status"] == "failed" and refused["request_counts"]["total"] == 0
    assert refused["errors"] == {
        "object": "list",
        "data": [
            {
                "code": "token_limit_exceeded",
                "param": None,
                "line": None,
                "message": f"Enqueued token limit reached for {MODEL} in organization org-sandbox. Limit: {cap:,} enqueued "
                "tokens. Please try again once some in_progress batches have been completed.",
            }
        ],
    }
    assert "," in f"{cap:,}" and f"Limit: {cap:,} enqueued" in refused["errors"]["data"][0]["message"]

    admin.set_scenario("normal", quota_enqueued_tokens=2 * tokens)  # exactly two batches: not past the cap
    third = submit(client, LINES)
    end_validation(admin)
    assert retrieve(client, third["id"])["status"] == "in_progress"
    admin.clock(advance_s=5.0)
    assert {retrieve(client, b["id"])["status"] for b in (first, third)} == {"completed"}
    billed = {e["batch_id"] for e in admin.ledger()}
    assert billed == {first["id"], third["id"]} and retrieve(client, second["id"])["output_file_id"] is None

    load = admin.load()
    assert assert_never_over(load, "openai", "tokens", 2 * tokens) == 2 * tokens
    by_batch = {(e["batch_id"], e["event"]) for e in load_events(load, "openai")}
    assert (second["id"], "refuse") in by_batch and (second["id"], "enqueue") not in by_batch
    assert {e["tokens"] for e in load_events(load, "openai") if e["event"] == "enqueue"} == {tokens, 2 * tokens}
    assert load["refusals"] == 1 and load_events(load, "openai")[-1]["tokens"] == 0  # all released at the end
    assert {(e["account"], e["model"]) for e in load["events"]} == {("sk-one", MODEL)}


def test_the_load_frees_when_a_batch_ends_and_two_keys_have_their_own_quota(keys, admin):
    one, two = keys
    tokens = batch_tokens(one, admin)
    admin.set_scenario("normal", quota_enqueued_tokens=tokens, in_progress_s=10.0)
    admin.clock(freeze=True)
    held = submit(one, LINES)
    other_key = submit(two, LINES)  # another account: its own cap
    blocked = submit(one, LINES)
    end_validation(admin)
    assert [retrieve(one, b["id"])["status"] for b in (held, blocked)] == ["in_progress", "failed"]
    assert retrieve(two, other_key["id"])["status"] == "in_progress"
    admin.clock(advance_s=11.0)  # the held batch completes and frees the queue
    assert retrieve(one, held["id"])["status"] == "completed"
    later = submit(one, LINES)
    end_validation(admin)
    assert retrieve(one, later["id"])["status"] == "in_progress"
    load = admin.load()
    for account in ("sk-one", "sk-two"):
        mine = [e for e in load_events(load, "openai") if e["account"] == account]
        assert max(e["tokens"] for e in mine) == tokens
    kinds = [(e["batch_id"], e["event"]) for e in load_events(load, "openai") if e["account"] == "sk-one"]
    assert kinds == [
        (held["id"], "enqueue"),
        (blocked["id"], "refuse"),
        (held["id"], "release"),
        (later["id"], "enqueue"),
    ]
    assert admin.load()["refusals"] == 1
    admin.reset()
    assert admin.load() == {"events": [], "peak": [], "refusals": 0}


def test_batch_creates_per_rolling_hour_are_a_429_until_the_hour_has_passed(keys, admin):
    one, two = keys
    admin.set_scenario("normal", quota_batches_per_hour=2)
    admin.clock(freeze=True)
    submit(one, LINES[:1])
    admin.clock(advance_s=600.0)
    submit(one, LINES[:1])  # exactly the cap
    with pytest.raises(openai.RateLimitError) as caught:
        submit(one, LINES[:1])
    assert caught.value.status_code == 429
    assert caught.value.code == "rate_limit_exceeded" and caught.value.type == "rate_limit_exceeded"
    assert "Limit: 2 batches per hour" in caught.value.message
    assert int(caught.value.response.headers["retry-after"]) == 3000  # the first create leaves the hour then
    submit(two, LINES[:1])  # another key: its own count
    admin.clock(advance_s=3001.0)
    submit(one, LINES[:1])  # the first create has left the rolling hour
    assert len(list(one.batches.list())) == 4 and admin.load()["refusals"] == 1


def test_azure_enqueued_tokens_are_per_key_and_deployment_and_free_when_a_batch_ends(sandbox_url, admin):
    def azure(key: str) -> openai.AzureOpenAI:
        return openai.AzureOpenAI(azure_endpoint=sandbox_url, api_key=key, api_version="2024-10-21", max_retries=0)

    lines = [
        {
            "custom_id": f"a{i}",
            "method": "POST",
            "url": "/chat/completions",
            "body": {"model": "my-deployment", "messages": [{"role": "user", "content": f"{TEXT} {i}"}]},
        }
        for i in range(4)
    ]

    def create(client: openai.AzureOpenAI) -> str:
        file_id = client.files.create(file=("in.jsonl", to_jsonl(lines)), purpose="batch").id
        return client.batches.create(input_file_id=file_id, endpoint="/chat/completions", completion_window="24h").id

    one, two = azure("az-one"), azure("az-two")
    probe = create(one)
    tokens = wait_for_azure(one, probe).usage.input_tokens
    admin.reset()
    admin.set_scenario("normal", quota_enqueued_tokens=tokens, in_progress_s=10.0)  # one batch per key
    admin.clock(freeze=True)
    held, other_key, refused = create(one), create(two), create(one)
    end_validation(admin)
    assert [one.batches.retrieve(held).status, two.batches.retrieve(other_key).status] == ["in_progress"] * 2
    batch = one.batches.retrieve(refused)
    assert batch.status == "failed" and batch.errors.data[0].code == "token_limit_exceeded"
    assert (
        f"Enqueued token limit reached for my-deployment in organization org-sandbox. Limit: {tokens:,} "
        "enqueued tokens."
    ) in batch.errors.data[0].message
    admin.clock(advance_s=11.0)  # both complete: the queue is free again
    later = create(one)
    end_validation(admin)
    assert one.batches.retrieve(later).status == "in_progress"
    load = admin.load()
    assert {(e["account"], e["model"]) for e in load_events(load, "azure")} == {
        ("az-one", "my-deployment"),
        ("az-two", "my-deployment"),
    }
    assert assert_never_over(load, "azure", "tokens", tokens) == tokens
    assert load_events(load, "openai") == [] and load["refusals"] == 1
    assert {e["batch_id"] for e in admin.ledger()} == {held, other_key}  # the refused batch bills nothing
    assert {e["provider"] for e in admin.ledger()} == {"azure_openai"}


def wait_for_azure(client: openai.AzureOpenAI, batch_id: str):
    return poll(lambda: (b := client.batches.retrieve(batch_id)).status == "completed" and b, "the batch completes")


def test_output_and_error_files_are_deleted_after_retention_and_not_before(keys, admin):
    client = keys[0]
    done = wait_for(client, submit(client, LINES[:3] + [chat_line("bad", "[[sandbox:poison]] x")])["id"])
    assert done["output_file_id"] and done["error_file_id"]
    admin.clock(freeze=True)
    files = [client.files.retrieve(done["output_file_id"]), client.files.retrieve(done["error_file_id"])]
    expires = files[0].expires_at
    assert expires == files[1].expires_at and expires - files[0].created_at in (30 * 24 * 3600, 30 * 24 * 3600 - 1)
    admin.clock(advance_s=expires - 5 - admin.clock()["now"])
    assert len(read_jsonl(client, done["output_file_id"])) == 3 and len(read_jsonl(client, done["error_file_id"])) == 1
    admin.clock(advance_s=10.0)
    for file_id in (done["output_file_id"], done["error_file_id"]):
        with pytest.raises(openai.NotFoundError) as gone:
            client.files.content(file_id)
        assert gone.value.status_code == 404 and gone.value.type == "invalid_request_error"
        assert file_id in gone.value.message
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(file_id)
    assert client.files.retrieve(done["input_file_id"]).purpose == "batch"  # inputs stay until deleted
    assert retrieve(client, done["id"])["output_file_id"] == done["output_file_id"]


def test_retention_follows_the_server_wide_param(keys, admin):
    client = keys[0]
    admin.set_scenario("normal", retention_openai_s=120)
    done = wait_for(client, submit(client, LINES[:2])["id"])
    admin.clock(freeze=True)
    assert len(read_jsonl(client, done["output_file_id"])) == 2
    admin.clock(advance_s=121.0)
    with pytest.raises(openai.NotFoundError):
        client.files.content(done["output_file_id"])


def test_the_held_load_survives_a_restart_with_a_state_dir(tmp_path):
    from batch_pipeline.sandbox import SandboxServer, make_scenario

    scenario = make_scenario("normal", {"quota_enqueued_tokens": 1, "in_progress_s": 3600.0})
    with SandboxServer(port=0, state_dir=str(tmp_path), scenario=scenario) as first:
        client = sdk(first.url, "sk-one")
        SandboxAdmin(first.url).set_scenario("normal", quota_enqueued_tokens=10**6, in_progress_s=3600.0)
        held = submit(client, LINES)
        before = SandboxAdmin(first.url).load()
    with SandboxServer(port=0, state_dir=str(tmp_path), scenario=scenario) as second:
        admin = SandboxAdmin(second.url)
        assert admin.load() == before and admin.load()["events"][-1]["tokens"] > 1000
        admin.set_scenario("normal", quota_enqueued_tokens=admin.load()["events"][-1]["tokens"] + 1)
        client = sdk(second.url, "sk-one")
        refused = wait_for(client, submit(client, LINES[:1])["id"])  # one more line passes the cap
        assert refused["status"] == "failed" and retrieve(client, held["id"])["status"] == "in_progress"
