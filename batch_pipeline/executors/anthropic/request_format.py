"""The Anthropic Message Batches requests: one ``{"custom_id", "params"}`` entry per item of a create call.

Requests carry the system prompt as one cacheable block (``cache_control: ephemeral``), so every request of a
job shares a cached prefix. A choice or JSON-schema contract becomes one forced tool (``answer``) whose
``input_schema`` is the contract; its ``input`` comes back as the output text (``format.py``), so
``{"label": ...}`` validates as a choice. Bedrock sends the same parameters (``bedrock/format.py``).
"""

import json
import re
from typing import Any

from batch_pipeline.core.errors import ConfigError
from batch_pipeline.core.ledger.executor import RequestPlan, ShardWork
from batch_pipeline.executors.output_contract import output_schema

TOOL_NAME = "answer"
CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def shared_params(plan: RequestPlan) -> dict[str, Any]:
    """Everything in ``params`` except the messages: model, limits, sampling, cacheable system, forced tool.

    ``sampling.seed`` is not sent: the Messages API has no seed.
    """
    sampling = plan.sampling
    if sampling.temperature > 1:
        raise ConfigError(f"sampling.temperature is {sampling.temperature}; Anthropic accepts 0 to 1")
    params: dict[str, Any] = {
        "model": plan.model,
        "max_tokens": sampling.max_tokens,
        "temperature": sampling.temperature,
    }
    if sampling.top_p is not None:
        params["top_p"] = sampling.top_p
    if plan.system:
        params["system"] = [{"type": "text", "text": plan.system, "cache_control": {"type": "ephemeral"}}]
    schema = output_schema(plan)
    if schema is not None:
        params["tools"] = [
            {"name": TOOL_NAME, "description": "Give the answer in the required structure.", "input_schema": schema}
        ]
        params["tool_choice"] = {"type": "tool", "name": TOOL_NAME}
    return params


def example_messages(plan: RequestPlan, cache: bool = True) -> list[dict[str, Any]]:
    """The few-shot examples as messages; with ``cache`` the last one ends on a ``cache_control`` breakpoint, so
    the cached prefix is the system prompt and every example (two of the four breakpoints a request may use)."""
    turns: list[dict[str, Any]] = list(plan.example_turns())
    if cache and turns:
        last = turns[-1]
        turns[-1] = {
            "role": last["role"],
            "content": [{"type": "text", "text": last["content"], "cache_control": {"type": "ephemeral"}}],
        }
    return turns


def batch_requests(work: ShardWork) -> tuple[list[dict[str, Any]], int]:
    """The ``requests`` of a create call, and an upper bound of the JSON body's size in bytes.

    ``messages``: the examples, then the item's turns (its one user message, or the row's turns)."""
    shared = shared_params(work.plan)
    examples = example_messages(work.plan)
    row_turns = work.plan.row_turns
    ids = work.items.column("request_id").to_pylist()
    prompts = work.items.column("user_prompt").to_pylist()
    bad = next((rid for rid in ids if not isinstance(rid, str) or not CUSTOM_ID.match(rid)), None)
    if bad is not None:
        raise ConfigError(f"request_id {bad!r} is not a valid Anthropic custom_id (^[a-zA-Z0-9_-]{{1,64}}$)")
    frame = len(
        json.dumps({"custom_id": "", "params": {**shared, "messages": [*examples, {"role": "user", "content": ""}]}})
    )
    # json.dumps of the prompt text bounds its turns too (a TURNS prompt is their JSON, escaped once more)
    size = 16 + sum(frame + 2 + len(rid) + len(json.dumps(prompt)) for rid, prompt in zip(ids, prompts))
    requests = [
        {"custom_id": rid, "params": {**shared, "messages": [*examples, *row_turns(prompt)]}}
        for rid, prompt in zip(ids, prompts)
    ]
    return requests, size
