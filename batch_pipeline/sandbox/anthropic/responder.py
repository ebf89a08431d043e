"""Deterministic Anthropic ``Message`` results for one batch request: markers, line errors, caching, content.

Content honours the request's output contract: when ``tool_choice`` forces one tool that has an
``input_schema`` (``{"type": "tool", "name": ...}``, or ``{"type": "any"}`` with a single tool), the answer is
a ``tool_use`` block whose ``input`` validates against that schema; otherwise it is a short text.
Prompt caching: every content block with ``cache_control`` is a breakpoint; the prefix up to a breakpoint
(tools, then system, then messages) is written to the cache the first time it is seen (if it holds at least
1024 tokens) and read from it afterwards. ``usage`` reports the written tokens as ``cache_creation_input_tokens``
(and per TTL in ``cache_creation``: ``ephemeral_5m_input_tokens``, or ``ephemeral_1h_input_tokens`` for a
breakpoint with ``"ttl": "1h"``), the read ones as ``cache_read_input_tokens``, and the rest as ``input_tokens``.
A cached prefix does not expire here (the TTL only labels the write).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from batch_pipeline.sandbox.ids import stable_hex
from batch_pipeline.sandbox.responder import CACHE_MIN_TOKENS, last_user_text, markers, render_content
from batch_pipeline.sandbox.scenarios import Scenario
from batch_pipeline.sandbox.schema_fill import fill_schema
from batch_pipeline.sandbox.store import BilledTokens
from batch_pipeline.sandbox.tokens import PER_MESSAGE_TOKENS, count_tokens, input_tokens, truncate_tokens

REFUSAL_MARKER, TRUNCATE_MARKER, POISON_MARKER = "refuse", "truncate", "poison"
SEEN_PREFIX = "anthropic|"  # keys in the state's shared memories (custom_ids seen, cached prefixes)


@dataclass
class AnthropicResult:
    """One processed request: its ``result`` object and token counts (``input_tokens`` excludes the cache)."""

    custom_id: str
    model: str
    result: dict[str, Any]
    input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    output_tokens: int = 0

    @property
    def succeeded(self) -> bool:
        """True for a ``succeeded`` result."""
        return self.result.get("type") == "succeeded"

    def billed(self) -> BilledTokens:
        """The tokens as billed: all of the input (uncached, cache writes and cache reads), the reads cached."""
        return BilledTokens(
            input_tokens=self.input_tokens + self.cache_creation_input_tokens + self.cache_read_input_tokens,
            cached_tokens=self.cache_read_input_tokens,
            output_tokens=self.output_tokens,
        )


@dataclass
class Segment:
    """A piece of the prompt in cache order, with its tokens and whether it carries ``cache_control``."""

    text: str
    tokens: int
    breakpoint: bool = False
    ttl: str = "5m"  # of the breakpoint's cache_control: "5m" (the default) or "1h"


@dataclass
class Prompt:
    """The prompt as cacheable segments."""

    segments: list[Segment] = field(default_factory=list)
    model: str = ""  # billed with its family's tokenizer (sandbox/tokens.py)

    def add(self, text: str, extra: int = 0, cache: str | None = None) -> None:
        """A segment; ``cache``: the TTL of its ``cache_control`` (None: not a breakpoint)."""
        self.segments.append(Segment(text, input_tokens(text, self.model) + extra, cache is not None, cache or "5m"))

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.segments)


def _blocks(content: Any) -> list[Any]:
    return content if isinstance(content, list) else [content]


def _block_text(block: Any) -> str:
    if isinstance(block, str):
        return block
    if isinstance(block, dict) and isinstance(block.get("text"), str):
        return str(block["text"])
    return json.dumps(block, sort_keys=True, ensure_ascii=False)


def _cache_ttl(block: Any) -> str | None:
    """The TTL a block's ``cache_control`` asks for ("5m" unless ``"ttl": "1h"``); None without one."""
    if not (isinstance(block, dict) and isinstance(block.get("cache_control"), dict)):
        return None
    return "1h" if block["cache_control"].get("ttl") == "1h" else "5m"


def build_prompt(params: dict[str, Any]) -> Prompt:
    """Tools, system blocks and message blocks, in the order the cache sees them."""
    prompt = Prompt(model=str(params.get("model") or ""))
    for tool in params.get("tools") or []:
        bare = {k: v for k, v in tool.items() if k != "cache_control"} if isinstance(tool, dict) else tool
        prompt.add(json.dumps(bare, sort_keys=True, ensure_ascii=False), cache=_cache_ttl(tool))
    system = params.get("system")
    if system:
        for block in _blocks(system):
            prompt.add(_block_text(block), cache=_cache_ttl(block))
    for message in params.get("messages") or []:
        if not isinstance(message, dict):
            continue
        for position, block in enumerate(_blocks(message.get("content"))):
            extra = PER_MESSAGE_TOKENS if position == 0 else 0
            prompt.add(_block_text(block), extra=extra, cache=_cache_ttl(block))
    return prompt


def forced_tool(params: dict[str, Any]) -> dict[str, Any] | None:
    """The tool that ``tool_choice`` forces, if it has an ``input_schema``."""
    tools = [t for t in params.get("tools") or [] if isinstance(t, dict)]
    choice = params.get("tool_choice")
    if not tools or not isinstance(choice, dict):
        return None
    tool = None
    if choice.get("type") == "tool":
        tool = next((t for t in tools if t.get("name") == choice.get("name")), None)
    elif choice.get("type") == "any" and len(tools) == 1:
        tool = tools[0]
    return tool if tool is not None and isinstance(tool.get("input_schema"), dict) else None


def errored(error_type: str, message: str) -> dict[str, Any]:
    """An ``errored`` result object."""
    return {"type": "errored", "error": {"type": "error", "error": {"type": error_type, "message": message}}}


class AnthropicRunner:
    """Answers one request of a batch; remembers custom_ids seen (``line_errors``) and cached prefixes."""

    def __init__(self, seen_custom_ids: dict[str, int], seen_prompts: set[str]) -> None:
        self.seen_custom_ids = seen_custom_ids
        self.seen_prompts = seen_prompts

    def run(self, batch_id: str, request: dict[str, Any], scenario: Scenario) -> AnthropicResult:
        """The result for ``request`` (``{"custom_id", "params"}``) under the batch's scenario."""
        custom_id, params = request["custom_id"], request["params"]
        model = str(params.get("model", ""))
        seen_key = SEEN_PREFIX + custom_id
        sightings = self.seen_custom_ids.get(seen_key, 0)
        self.seen_custom_ids[seen_key] = sightings + 1
        marks = markers(params)
        if POISON_MARKER in marks:
            return AnthropicResult(
                custom_id,
                model,
                errored("invalid_request_error", "prompt is too long or malformed (sandbox marker poison)."),
            )
        if scenario.line_error_due(custom_id, sightings):
            return AnthropicResult(
                custom_id, model, errored("api_error", "Internal server error (sandbox scenario line_errors).")
            )
        prompt = build_prompt(params)
        creation, read, by_ttl = self._cache(model, prompt)
        content, output_tokens, stop_reason = self._content(batch_id, custom_id, params, marks)
        message = {
            "id": "msg_" + stable_hex(batch_id, custom_id, "message"),
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": {
                "input_tokens": prompt.tokens - creation - read,
                "output_tokens": output_tokens,
                "cache_creation_input_tokens": creation,
                "cache_read_input_tokens": read,
                "cache_creation": {
                    "ephemeral_5m_input_tokens": by_ttl["5m"],
                    "ephemeral_1h_input_tokens": by_ttl["1h"],
                },
                "service_tier": "batch",
            },
        }
        return AnthropicResult(
            custom_id,
            model,
            {"type": "succeeded", "message": message},
            prompt.tokens - creation - read,
            creation,
            read,
            output_tokens,
        )

    def _cache(self, model: str, prompt: Prompt) -> tuple[int, int, dict[str, int]]:
        """(cache_creation, cache_read, cache_creation by TTL) tokens; marks every eligible breakpoint prefix as
        cached. Written tokens between two breakpoints take the TTL of the breakpoint that ends them."""
        digest = hashlib.sha256(model.encode("utf-8"))
        running = 0
        eligible: list[tuple[str, int, str]] = []
        for segment in prompt.segments:
            digest.update(b"\x1e" + segment.text.encode("utf-8"))
            running += segment.tokens
            if segment.breakpoint and running >= CACHE_MIN_TOKENS:
                eligible.append((SEEN_PREFIX + digest.hexdigest(), running, segment.ttl))
        by_ttl = {"5m": 0, "1h": 0}
        if not eligible:
            return 0, 0, by_ttl
        read = max((tokens for key, tokens, _ in eligible if key in self.seen_prompts), default=0)
        start = read
        for _, tokens, ttl in eligible:
            if tokens > start:
                by_ttl[ttl] += tokens - start
                start = tokens
        self.seen_prompts.update(key for key, _, _ in eligible)
        return eligible[-1][1] - read, read, by_ttl

    @staticmethod
    def _content(
        batch_id: str, custom_id: str, params: dict[str, Any], marks: set[str]
    ) -> tuple[list[dict[str, Any]], int, str]:
        """(content blocks, output tokens, stop_reason)."""
        if REFUSAL_MARKER in marks:
            return [{"type": "text", "text": ""}], 0, "refusal"
        limit = params.get("max_tokens")
        limit = limit if isinstance(limit, int) and not isinstance(limit, bool) else None
        tool = forced_tool(params)
        text = last_user_text(params)
        system = params.get("system")
        instructions = (
            system
            if isinstance(system, str)
            else " ".join(b.get("text", "") for b in system or [] if isinstance(b, dict))
        )
        rendered = (
            json.dumps(fill_schema(tool["input_schema"], text, instructions), ensure_ascii=False)
            if tool
            else render_content({"messages": params.get("messages") or []})
        )
        produced = count_tokens(rendered)
        if TRUNCATE_MARKER in marks:
            limit = min(limit, produced // 2) if limit is not None else produced // 2
        truncated = limit is not None and (produced > limit or TRUNCATE_MARKER in marks)
        if tool is not None:
            block = {
                "type": "tool_use",
                "id": "toolu_" + stable_hex(batch_id, custom_id, "tool"),
                "name": tool["name"],
                "input": {} if truncated else json.loads(rendered),
            }
            return (
                [block],
                (limit if truncated and limit is not None else produced),
                ("max_tokens" if truncated else "tool_use"),
            )
        if truncated:
            assert limit is not None
            rendered = truncate_tokens(rendered, limit)
        return [{"type": "text", "text": rendered}], count_tokens(rendered), "max_tokens" if truncated else "end_turn"
