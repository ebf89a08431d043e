"""A chat-messages job with few-shot examples on real vLLM (the tiny model): the chat template gets system,
examples, then each row's turns in order (the renderer's token IDs are the template's own), and the examples are
part of the cached prefix, so the cached share of all input tokens stays above 0.8."""

import json

import polars as pl

from batch_pipeline.core.ledger.executor import ItemShape, RequestPlan
from batch_pipeline.core.ledger.result_parts import read_results
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline.defs.pipeline import run_job
from batch_pipeline.executors.vllm.prompts import PromptRenderer

from .conftest import LABELS, SYSTEM

EXAMPLES = []
for i, label in enumerate(LABELS * 3):
    EXAMPLES += [
        {"role": "user", "content": f"Example ticket {i}: " + f"the customer writes about {label} " * 12},
        {"role": "assistant", "content": label},
    ]


def rows(n: int) -> list[dict]:
    return [
        {
            "id": f"c{i}",
            "messages": [
                {"role": "user", "content": f"hello, ticket {i}"},
                {"role": "assistant", "content": "How can I help?"},
                {"role": "user", "content": f"my invoice {i} is wrong"},
            ],
        }
        for i in range(n)
    ]


def test_the_renderer_gives_the_chat_templates_own_tokens_for_examples_and_turns(tiny_model):
    from transformers import AutoTokenizer  # the vLLM tier's venv only (the module loads without it)

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    plan = RequestPlan(
        "m", SYSTEM, None, None, examples=tuple((t["role"], t["content"]) for t in EXAMPLES[:4]), shape=ItemShape.TURNS
    )
    prompts = [json.dumps(r["messages"], separators=(",", ":")) for r in rows(3)]
    got = PromptRenderer.for_plan(tokenizer, plan).token_ids(prompts)
    for ids, row in zip(got, rows(3), strict=True):
        messages = [{"role": "system", "content": SYSTEM}, *EXAMPLES[:4], *row["messages"]]
        want = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        want = want["input_ids"] if hasattr(want, "keys") else want  # a BatchEncoding in transformers 5
        assert ids == list(want)
        text = tokenizer.decode(ids)
        at = 0
        for m in messages:  # system, examples, then the row's turns, each after the one before
            at = text.index(f"{m['role']}<|end_header_id|>\n\n{m['content']}<|eot_id|>", at) + 1


def test_a_messages_job_keeps_the_cached_share_above_0_8_with_the_examples_in_the_prefix(
    make_job, instance, resources, home
):
    spec = make_job(
        "vchat",
        rows=rows(20),
        settings={"max_model_len": 4096},
        input={
            "path": str(home.parent / "data" / "in" / "vchat" / "*.jsonl"),
            "messages_field": "messages",
            "key_field": "id",
            "max_input_tokens": 4000,
        },
        prompt={"version": "v1", "system": SYSTEM, "examples": EXAMPLES},
    )
    report = run_job(spec, instance, resources)
    assert report["complete"] and report["succeeded"] == 20
    results = read_results(Store(home), "vchat")
    share = results["cached_tokens"].sum() / results["input_tokens"].sum()
    assert share > 0.8, share
    # more than the system prompt is cached: the examples are in the shared prefix
    from transformers import AutoTokenizer  # the vLLM tier's venv only (the module loads without it)

    tokenizer = AutoTokenizer.from_pretrained(spec.backend.settings["model"])
    system_only = tokenizer.apply_chat_template([{"role": "system", "content": SYSTEM}], tokenize=True)
    system_only = len(system_only["input_ids"] if hasattr(system_only, "keys") else system_only)
    warm = results.filter(pl.col("cached_tokens") > 0)
    assert warm.height >= 19 and int(warm["cached_tokens"].min()) > 2 * system_only
    validated = pl.read_parquet(Store(home).local_path(JobPaths("vchat").validated))
    assert validated.height == 20 and set(validated["output"]) <= set(LABELS)
