"""The sandbox's Anthropic usage on a cacheable prefix: written on the first sighting, read after, labelled by TTL."""

from batch_pipeline.sandbox.anthropic.responder import AnthropicRunner
from batch_pipeline.sandbox.scenarios import Scenario

LONG_SYSTEM = "Label the support ticket with exactly one of the allowed labels. " * 100  # > 1024 tokens


def request(custom_id: str, ttl: str | None = None, system: str = LONG_SYSTEM) -> dict:
    cache_control = {"type": "ephemeral", **({"ttl": ttl} if ttl else {})}
    return {
        "custom_id": custom_id,
        "params": {
            "model": "claude-haiku-4-5",
            "max_tokens": 16,
            "messages": [{"role": "user", "content": f"ticket {custom_id}"}],
            "system": [{"type": "text", "text": system, "cache_control": cache_control}],
        },
    }


def usage(runner: AnthropicRunner, req: dict) -> dict:
    return runner.run("msgbatch_1", req, Scenario()).result["message"]["usage"]


def test_a_cacheable_prefix_is_written_once_then_read_and_the_write_carries_its_ttl():
    runner = AnthropicRunner({}, set())
    first, second = usage(runner, request("a")), usage(runner, request("b"))
    prefix = first["cache_creation_input_tokens"]
    assert prefix >= 1024 and first["cache_read_input_tokens"] == 0
    assert first["cache_creation"] == {"ephemeral_5m_input_tokens": prefix, "ephemeral_1h_input_tokens": 0}
    assert second["cache_creation_input_tokens"] == 0 and second["cache_read_input_tokens"] == prefix
    assert second["input_tokens"] == first["input_tokens"]  # input_tokens excludes both writes and reads
    hour = usage(runner, request("c", ttl="1h", system=LONG_SYSTEM + " Be brief."))
    assert (
        hour["cache_creation"]
        == {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": hour["cache_creation_input_tokens"]}
        and hour["cache_creation_input_tokens"] > 1024
    )
    short = usage(runner, request("d", system="Short."))
    assert short["cache_creation_input_tokens"] == short["cache_read_input_tokens"] == 0  # below the minimum
