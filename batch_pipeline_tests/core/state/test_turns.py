"""The loops' own rules, decided once: the map from actions to runs, the repeat limits and the stuck rule."""

import pytest

from batch_pipeline.core.spec.loading import parse_spec
from batch_pipeline.core.state.driver import Action
from batch_pipeline.core.state.turns import MOVES, SENDS, STAGE_OF, RunStage, TurnLimits

SPEC = """
name: turns
input: {path: in.jsonl, text_field: body}
prompt: {version: v1, template: "{body}"}
model: gpt-4o-mini
backend: {name: openai_batch}
sampling: {max_tokens: 8}
output: {choice: [a, b]}
retries: {per_item: 4}
"""


def test_every_action_is_carried_by_exactly_one_run():
    assert set(STAGE_OF) == set(Action)
    assert {STAGE_OF[a] for a in (*SENDS, Action.CANARY)} == {RunStage.SUBMIT}
    assert MOVES == (Action.SUBMIT, Action.RESOLVE, Action.RESCUE, Action.COLLECT)
    assert Action.CANARY not in MOVES  # the canary runs alone, never inside a pass
    assert (STAGE_OF[Action.REQUOTE], STAGE_OF[Action.PUBLISH]) == (RunStage.QUOTE, RunStage.PUBLISH)


def test_limits_follow_the_item_budget():
    limits = TurnLimits.for_spec(parse_spec(SPEC))
    assert (limits.passes, limits.canaries, limits.requotes) == (6, 5, 3)


@pytest.mark.parametrize("failures, stuck", [(0, False), (2, False), (3, True), (7, True)])
def test_a_shard_is_stuck_after_three_failed_runs_of_one_step(failures, stuck):
    limits = TurnLimits(passes=1, canaries=1)
    assert limits.stuck(failures) is stuck
    assert limits.stuck_reason(["s1", "s2"]) == "shard(s) s1, s2 failed 3 runs in a row: look at their runs"


def test_each_repeat_limit_says_why_only_once_passed():
    limits = TurnLimits(passes=2, canaries=2, idle_queue_turns=1)
    assert limits.too_many_requotes(3, "plan") is None
    assert limits.too_many_requotes(4, "plan") == "the quote stays stale after 3 re-quotes: plan"
    assert limits.too_many_canaries(2, "s1", "plan") is None
    assert limits.too_many_canaries(3, "s1", "plan") == "the canary shard s1 got no verdict after 2 attempts: plan"
    assert limits.queue_never_fits(1, "j", "plan") is None
    assert limits.queue_never_fits(2, "j", "plan").startswith(
        "job j: nothing it sends fits the account's queue even when the queue is empty: plan; raise"
    )
