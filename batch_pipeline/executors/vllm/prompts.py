"""What goes into the vLLM engine: prompts rendered through the chat template (stable prefix first), the
sampling parameters that carry the output contract, and the order of the items."""

import json
import random
from typing import Any

from batch_pipeline.core.ledger.executor import ItemShape, RequestPlan
from batch_pipeline.executors.vllm.engine import VllmSettings

_SENTINEL = "\x00batch-pipeline-user\x00"


class PromptRenderer:
    """(system, few-shot examples, user) -> token IDs through the chat template.

    The template is rendered once and spliced around each user message when that is exact (checked on a probe),
    and the stable head up to its last special token is tokenized once: text after an added token tokenizes
    on its own, so only the per-row rest is tokenized per item (the same IDs, checked on the probe). The
    examples are part of that head, so they are the same tokens in every request (the engine's cached prefix).
    Items that hold chat turns (``ItemShape.TURNS``) are rendered whole, each behind the same tokenized head.
    """

    PROBE = "probe {x} ünï\n text  "

    def __init__(
        self, tokenizer: Any, system: str, examples: tuple[tuple[str, str], ...] = (), shape: ItemShape = ItemShape.TEXT
    ) -> None:
        self.tokenizer, self.system, self.shape = tokenizer, system, shape
        self.lead = ([{"role": "system", "content": system}] if system else []) + [
            {"role": role, "content": content} for role, content in examples
        ]
        self.head_tail: tuple[str, str] | None = None
        self._prefix_ids: list[int] | None = None
        self._prefix_text = ""
        self._rest_head = ""
        whole = self._render(_SENTINEL)
        if whole.count(_SENTINEL) != 1:
            return
        head, tail = whole.split(_SENTINEL)
        if self._render(self.PROBE) != head + self.PROBE + tail:
            return
        self.head_tail = (head, tail)
        cut = self._after_last_special(head)
        if cut:
            prefix = self._encode([head[:cut]])[0]
            probe = self._encode([head + self.PROBE + tail])[0]
            if prefix + self._encode([head[cut:] + self.PROBE + tail])[0] == probe:
                self._prefix_ids, self._rest_head, self._prefix_text = prefix, head[cut:], head[:cut]

    @classmethod
    def for_plan(cls, tokenizer: Any, plan: RequestPlan) -> "PromptRenderer":
        return cls(tokenizer, plan.system, plan.examples, plan.shape)

    def _render(self, user: str) -> str:
        return self._render_turns([{"role": "user", "content": user}])

    def _render_turns(self, turns: list[dict[str, str]]) -> str:
        return self.tokenizer.apply_chat_template([*self.lead, *turns], tokenize=False, add_generation_prompt=True)

    def _turn_ids(self, prompts: list[str]) -> list[list[int]]:
        """Each item's turns rendered whole; the tokenized head reused where the text starts with it."""
        texts = [self._render_turns(json.loads(p)) for p in prompts]
        cut, prefix = len(self._prefix_text), self._prefix_ids
        if prefix is None or not all(t.startswith(self._prefix_text) for t in texts):
            return self._encode(texts)
        return [prefix + ids for ids in self._encode([t[cut:] for t in texts])]

    def _encode(self, texts: list[str]) -> list[list[int]]:
        return self.tokenizer(texts, add_special_tokens=False)["input_ids"]

    def _after_last_special(self, text: str) -> int:
        """End of the last added token in ``text`` that keeps the whitespace after it (0: none)."""
        end = 0
        for tok in (getattr(self.tokenizer, "added_tokens_decoder", None) or {}).values():
            at = text.rfind(tok.content) if tok.content and not getattr(tok, "rstrip", True) else -1
            if at >= 0:
                end = max(end, at + len(tok.content))
        return end

    def token_ids(self, users: list[str]) -> list[list[int]]:
        """Token IDs of each item's prompt (``users``: the items' ``user_prompt``, text or turns JSON)."""
        if self.shape is ItemShape.TURNS:
            return self._turn_ids(users)
        if self.head_tail is None:
            return self._encode([self._render(u) for u in users])
        head, tail = self.head_tail
        if self._prefix_ids is None:
            return self._encode([head + u + tail for u in users])
        prefix, rest = self._prefix_ids, self._rest_head
        return [prefix + ids for ids in self._encode([rest + u + tail for u in users])]


def sampling_params(plan: RequestPlan, settings: VllmSettings):
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

    max_tokens = plan.sampling.max_tokens
    structured = None
    if plan.output.choice is not None:
        structured = StructuredOutputsParams(choice=list(plan.output.choice))
        max_tokens = min(max_tokens, max(len(c.encode()) for c in plan.output.choice) + 1)
    elif plan.output.json_schema is not None:
        structured = StructuredOutputsParams(
            json=plan.output.json_schema, disable_any_whitespace=settings.disable_any_whitespace
        )
    return SamplingParams(
        temperature=plan.sampling.temperature,
        top_p=plan.sampling.top_p or 1.0,
        seed=plan.sampling.seed,
        max_tokens=max_tokens,
        structured_outputs=structured,
        ignore_eos=settings.ignore_eos and structured is None,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )


def order_items(lengths: list[int], bucket_tokens: int, seed: int, preflight: int) -> tuple[list[int], list[int]]:
    """(pre-flight indexes: the longest, the rest: length buckets longest first, shuffled within a bucket)."""
    by_len = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    first, rest = by_len[:preflight], by_len[preflight:]
    buckets: dict[int, list[int]] = {}
    for i in rest:
        buckets.setdefault(lengths[i] // bucket_tokens, []).append(i)
    rng = random.Random(seed)
    ordered: list[int] = []
    for b in sorted(buckets, reverse=True):
        members = buckets[b]
        rng.shuffle(members)
        ordered.extend(members)
    return first, ordered
