"""The routing table: each case's expected backend and deciding rule (core/route/rules.py)."""

import pytest

from batch_pipeline.core.route.rules import CHEAPEST, RULES, Candidate, ShardFacts, choose

OPENAI = Candidate("openai_batch", "gpt-4o-mini", batch=True, max_requests=50_000, turnaround_h=24, cost_usd=0.50)
BEDROCK = Candidate(
    "bedrock_batch",
    "meta.llama3-1-8b-instruct-v1:0",
    batch=True,
    min_requests=100,
    max_requests=50_000,
    turnaround_h=24,
    cost_usd=0.20,
)
ONLINE = Candidate("online", "gpt-4o-mini", cost_usd=1.00)
VLLM = Candidate("vllm", "qwen2.5-7b-instruct", self_hosted=True, cost_usd=None)
ALL = [OPENAI, BEDROCK, ONLINE, VLLM]

CASES = [
    # (case, shard facts, expected backend, expected rule)
    ("cheapest", ShardFacts("s", 500), "bedrock_batch", CHEAPEST),
    ("governance", ShardFacts("s", 500, data_may_leave=False), "vllm", "governance"),
    ("deadline", ShardFacts("s", 500, hours_to_deadline=3.0), "online", "deadline"),
    ("tiny shard", ShardFacts("s", 10, min_batch_items=50), "online", "tiny_shard"),
    ("bedrock minimum", ShardFacts("s", 60, min_batch_items=50), "openai_batch", "provider_minimum"),
    ("provider limit", ShardFacts("s", 60_000), "online", "provider_limit"),
    ("deadline far enough", ShardFacts("s", 500, hours_to_deadline=30.0), "bedrock_batch", CHEAPEST),
]


@pytest.mark.parametrize("case,facts,backend,rule", CASES, ids=[c[0] for c in CASES])
def test_the_table_picks_the_expected_backend_for_the_expected_reason(case, facts, backend, rule):
    choice = choose(ALL, facts)
    assert (choice.backend, choice.rule) == (backend, rule)
    assert choice.reason and choice.costs["openai_batch/gpt-4o-mini"] == 0.50
    if rule != CHEAPEST:
        assert rule in choice.reason and any(v.startswith(rule) for v in choice.excluded.values())


def test_no_candidate_left_says_why_for_each():
    choice = choose([OPENAI, ONLINE], ShardFacts("s", 500, data_may_leave=False))
    assert choice.backend is None and choice.rule == "none"
    assert "openai_batch/gpt-4o-mini (governance" in choice.reason and "online/gpt-4o-mini" in choice.reason


def test_the_rules_are_a_table_in_order():
    assert [r.name for r in RULES] == [
        "governance",
        "tiny_shard",
        "provider_minimum",
        "provider_limit",
        "deadline",
        "queue_full",
    ]
    # a later rule does not hide an earlier one: governance first, even when the deadline also excludes
    choice = choose([OPENAI, VLLM], ShardFacts("s", 500, data_may_leave=False, hours_to_deadline=1.0))
    assert choice.backend == "vllm" and choice.excluded["openai_batch/gpt-4o-mini"].startswith("governance")


FULL_BEDROCK = Candidate(
    "bedrock_batch",
    "meta.llama3-1-8b-instruct-v1:0",
    batch=True,
    min_requests=100,
    max_requests=50_000,
    turnaround_h=24,
    cost_usd=0.20,
    queue_wait_h=10.0,
)


@pytest.mark.parametrize(
    "hours,backend,rule",
    [(None, "bedrock_batch", CHEAPEST), (40.0, "bedrock_batch", CHEAPEST), (30.0, "openai_batch", "queue_full")],
    ids=[
        "no deadline: the full queue is waited for",
        "room + window inside the deadline",
        "room + window past the deadline",
    ],
)
def test_a_full_queue_loses_to_the_next_cheapest_only_when_waiting_would_miss_the_deadline(hours, backend, rule):
    choice = choose([OPENAI, FULL_BEDROCK, ONLINE], ShardFacts("s", 500, hours_to_deadline=hours))
    assert (choice.backend, choice.rule) == (backend, rule)
    if rule == "queue_full":
        why = choice.excluded["bedrock_batch/meta.llama3-1-8b-instruct-v1:0"]
        assert why == (
            "queue_full: its queue is full (room within 10.0 h), and with its 24 h window that ends after "
            "the deadline 30.0 h away"
        )


def test_a_queue_that_never_has_room_says_so():
    never = Candidate(
        "openai_batch", "gpt-4o-mini", batch=True, turnaround_h=24, cost_usd=0.1, queue_wait_h=float("inf")
    )
    choice = choose([never, ONLINE], ShardFacts("s", 500, hours_to_deadline=100.0))
    assert choice.backend == "online" and "no room in sight" in choice.reason
