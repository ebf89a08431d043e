"""Few-shot examples (``prompt.examples``) are sent with every request, golden probes and the fallback's included:
the quote's probe and fallback passes count them (their text and each turn's framing) within 3% of what the
sandbox bills through the real ``openai`` SDK, and the budget guard estimates a probe as the manifest estimates an
item (the examples in its fixed part)."""

import math

import polars as pl
import pytest

from batch_pipeline.core.manifest.shards import Manifest
from batch_pipeline.core.money.quote import probe_estimates
from batch_pipeline.core.pricing.cost import fixed_request_tokens
from batch_pipeline.core.quality.golden import GoldenProbes
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline.defs.pipeline import run_job

from .conftest import REPO

EXAMPLES = [
    {"role": "user", "content": "Subject: refund\nTicket:\nI was charged twice for my plan this month."},
    {"role": "assistant", "content": "billing"},
    {"role": "user", "content": "Subject: crash\nTicket:\nThe app closes whenever I open the settings page."},
    {"role": "assistant", "content": "bug"},
]
PROMPT = {
    "version": "v1",
    "system": "Label the ticket.",
    "template": "Subject: {subject}\nTicket:\n{body}",
    "examples": EXAMPLES,
}
QUALITY = {
    "golden": str(REPO / "data" / "golden" / "demo.jsonl"),
    "canary_min_accuracy": 0.0,
    "golden_share": 0.1,
    "eval_backend": {"name": "online", "settings": {"sandbox": True}},
}


def first_quote(store: Store, job: str) -> dict:
    return store.read_json(sorted(store.list_files(f"{JobPaths(job).root}/quotes", suffix=".json"))[0])


def test_the_probe_pass_counts_the_examples_and_the_guard_estimates_a_probe_like_an_item(
    sandbox, make_job, instance, resources, home
):
    spec = make_job(prompt=PROMPT, quality=QUALITY, canary_first=False)
    report = run_job(spec, instance, resources)
    assert report["complete"]
    store = Store(home)
    manifest = Manifest(spec.name, store)
    probes = pl.concat([GoldenProbes(spec, store).recorded(s) for s in manifest.shard_ids()])
    billed = {e["custom_id"]: e["input_tokens"] for e in sandbox.ledger()}
    assert set(probes["request_id"]) <= set(billed)  # every probe was answered, once
    probe_tokens = sum(billed[r] for r in probes["request_id"])
    quote = first_quote(store, spec.name)
    assert quote["probe_requests"] == probes.height
    assert quote["passes"]["probes"]["input_tokens"] == pytest.approx(probe_tokens, rel=0.03)
    # the budget guard's estimate of a probe (bytes / 4 and framing, before calibration) is the manifest's estimate
    # of an item with the same prompt: system and examples included
    estimated = probe_estimates(spec, probes)["est_input_tokens"].to_list()
    prefix_bytes = len((PROMPT["system"] + "".join(t["content"] for t in EXAMPLES)).encode())
    assert estimated == [
        math.ceil(len(p.encode()) / 4) + fixed_request_tokens(prefix_bytes) for p in probes["user_prompt"].to_list()
    ]
    items = pl.from_arrow(manifest.item_index(["request_id", "est_input_tokens"]))
    per_item = float(items["est_input_tokens"].mean()) / (sum(billed[r] for r in items["request_id"]) / items.height)
    per_probe = sum(estimated) / probe_tokens
    assert per_probe == pytest.approx(per_item, rel=0.15)  # the same estimate, off by the same share


def test_the_fallback_pass_counts_the_examples(sandbox, make_job, instance, resources, home):
    # every item fails twice on the primary (its budget, per_item 2), then the fallback answers it
    spec = make_job(
        prompt=PROMPT, fallback={"model": "gpt-4o"}, canary_first=False, retries={"per_item": 2, "spend_cap_share": 1.0}
    )
    sandbox.set_scenario("line_errors", rate=1.0, times=2)
    report = run_job(spec, instance, resources)
    assert report["complete"] and report["fallback"]["answered"] == report["unique_requests"]
    fallback = [e["input_tokens"] for e in sandbox.ledger() if e["model"] == "gpt-4o"]
    assert len(fallback) == report["unique_requests"]
    quoted = first_quote(Store(home), spec.name)["passes"]["fallback"]
    assert quoted["model"] == "gpt-4o" and quoted["measured_on"] == 0
    assert quoted["input_tokens_per_request"] == pytest.approx(sum(fallback) / len(fallback), rel=0.03)
