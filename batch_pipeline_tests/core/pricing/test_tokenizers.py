"""The quote's tokenizers: a registry keyed by model family; o200k_base offline and exact; open models through
their tokenizer.json; Claude and Gemini by their documented density; the request token model on a sample."""

import inspect
import math

import bpe_openai
import polars as pl
import pytest
import tiktoken_ext.openai_public

from batch_pipeline.bpe import BPE
from batch_pipeline.core.money.estimate import prompt_sample, request_tokens, schema_text
from batch_pipeline.core.pricing.tokenizers import (
    CLAUDE_CHARS_PER_TOKEN,
    GEMINI_CHARS_PER_TOKEN,
    BpeCounter,
    DensityCounter,
    TokenizerFileCounter,
    counter_for,
    family,
)
from batch_pipeline.core.spec.loading import parse_spec

TEXTS = [
    "Hello, world! How's it going?",
    "Order #1234567 was charged $19.99 twice (2026-11-30).",
    "Ünïcödé, 日本語のテキスト, emoji 🙂 and\ttabs\n\nnew lines",
    "  leading spaces",
    "",
    "a" * 5000,
    "<|endoftext|> is plain text here",
]


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("gpt-4o-mini", "o200k"),
        ("gpt-4.1-nano", "o200k"),
        ("o3-mini", "o200k"),
        ("gpt-4-turbo", "cl100k"),
        ("claude-haiku-4-5", "claude"),
        ("anthropic.claude-3-5-haiku-20241022-v1:0", "claude"),
        ("us.anthropic.claude-sonnet-4-5-v1:0", "claude"),
        ("gemini-2.5-flash", "gemini"),
        ("publishers/google/models/gemini-2.0-flash-001", "gemini"),
        ("meta.llama3-1-8b-instruct-v1:0", "open"),
        ("qwen2.5-7b-instruct", "open"),
        ("some-new-model", "bytes"),
    ],
)
def test_each_model_name_maps_to_its_family(model, expected):
    assert family(model) == expected


def test_o200k_is_exact_offline_and_agrees_with_an_independent_implementation():
    ours = BpeCounter("o200k_base").count(TEXTS)
    reference = bpe_openai.get_encoding("o200k_base")  # the Rust bpe crate, not tiktoken
    assert ours == [len(reference.encode_ordinary(t)) for t in TEXTS]
    assert counter_for("gpt-4o-mini").exact and counter_for("gpt-4o-mini").name == "o200k_base"
    # the ranks are the ones tiktoken would download: its own published hashes
    source = inspect.getsource(tiktoken_ext.openai_public)
    assert all(digest in source for digest, _ in BPE.values())


def test_claude_and_gemini_use_the_documented_density():
    claude, gemini = counter_for("claude-haiku-4-5"), counter_for("gemini-2.5-flash")
    assert not claude.exact and not gemini.exact
    assert claude.count(TEXTS) == [math.ceil(len(t) / CLAUDE_CHARS_PER_TOKEN) for t in TEXTS]
    assert gemini.count(TEXTS) == [math.ceil(len(t) / GEMINI_CHARS_PER_TOKEN) for t in TEXTS]
    assert DensityCounter("b", 4.0, unit="bytes").count(["é"]) == [1] and counter_for("x-new").count(["abcdefghi"]) == [
        3
    ]


def test_an_open_model_is_counted_with_its_tokenizer_json(tmp_path):
    from tokenizers import Tokenizer

    from batch_pipeline.models.tiny_llama import build_tiny_llama

    model_dir = build_tiny_llama(tmp_path / "tiny-llama", weights=False)
    counter = counter_for("tiny-llama", {"model": str(model_dir)})
    assert isinstance(counter, TokenizerFileCounter) and counter.exact
    own = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert counter.count(TEXTS) == [len(own.encode(t, add_special_tokens=False).ids) for t in TEXTS]
    assert counter.count(TEXTS) != BpeCounter("cl100k_base").count(TEXTS)  # its own vocabulary, not a stand-in
    # without a local file: cl100k_base, marked as an approximation
    fallback = counter_for("llama-3.1-8b-instruct", {"model": str(tmp_path / "missing")})
    assert fallback.name == "cl100k_base" and not fallback.exact


SPEC = """
name: tk
input: {path: in.jsonl, text_field: body}
prompt: {version: v1, system: "Label the ticket as billing or bug.", template: "{body}"}
model: gpt-4o-mini
backend: {name: openai_batch, settings: {sandbox: true}}
sampling: {max_tokens: 16}
output: {choice: [billing, bug]}
"""


def test_the_request_model_counts_the_fixed_part_exactly_and_rescales_the_user_part():
    spec = parse_spec(SPEC)
    prompts = ["My invoice 123 was charged twice, please refund it.", "The app crashes on start."] * 5
    est = [math.ceil(len(p.encode()) / 4) + (math.ceil(len(spec.prompt.system) / 4) + 4) + 7 for p in prompts]
    model = request_tokens(spec, pl.DataFrame({"user_prompt": prompts, "est_input_tokens": est}))
    o200k = BpeCounter("o200k_base")
    assert model.system_tokens == o200k.count([spec.prompt.system])[0]
    assert model.schema_tokens == o200k.count([schema_text(spec)])[0]
    assert model.fixed_tokens == model.system_tokens + 4 + 4 + 3 + model.schema_tokens
    exact = sum(o200k.count(prompts)) + len(prompts) * model.fixed_tokens
    assert model.tokens(sum(est), len(prompts)) == pytest.approx(exact, rel=1e-9)  # the sample is the whole set
    assert model.sampled == 10 and model.exact


def test_the_prompt_sample_spreads_over_shards_and_keeps_only_pending_items(tmp_path):
    from batch_pipeline.core.manifest.shards import Manifest, build_manifest
    from batch_pipeline.core.store import Store

    (tmp_path / "in.jsonl").write_text("".join(f'{{"body": "ticket {i} about billing"}}\n' for i in range(60)))
    spec = parse_spec(SPEC.replace("path: in.jsonl", f"path: {tmp_path}/in.jsonl") + "shards: {max_requests: 5}\n")
    store = Store(tmp_path / "home")
    build_manifest(spec, store)
    manifest = Manifest(spec.name, store)
    index = pl.from_arrow(manifest.item_index(["request_id", "shard_id"]))
    assert len(manifest.shard_ids()) >= 8
    pending = index.filter(pl.col("shard_id") != manifest.shard_ids()[0])
    sample = prompt_sample(manifest, pending, limit=16, shards=4)
    assert 0 < sample.height <= 16
    assert sample.join(index, on="request_id")["shard_id"].n_unique() == 4  # spread over 4 shards
    first_shard = pl.from_arrow(manifest.shard_items(manifest.shard_ids()[0], ["user_prompt"]))["user_prompt"]
    assert not set(sample["user_prompt"]) & set(first_shard)  # nothing from the shard that is done
    assert prompt_sample(manifest, pending.head(0)).height == 0


def test_counting_reads_the_shipped_rank_files_without_bpe_openai():
    """The rank files ship with batch_pipeline: counting never imports bpe-openai (a test-only reference), whose
    ``__init__`` loads every encoding it ships (~0.8 s)."""
    import subprocess
    import sys

    code = (
        "import sys; from batch_pipeline.bpe import encoding; "
        "assert encoding('o200k_base').encode('hello world') == [24912, 2375]; "
        "assert 'bpe_openai' not in sys.modules, 'bpe_openai was imported'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
