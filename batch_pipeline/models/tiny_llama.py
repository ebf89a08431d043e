"""A tiny random-weight Llama, built locally and deterministically: nothing is downloaded.

``build_tiny_llama(out_dir, seed=0)`` writes a Hugging Face model directory that vLLM and transformers load
like any other:

- ``config.json``: ``LlamaForCausalLM``, hidden 128, 2 layers, 2 heads of 64, vocab 2048 (by default);
- ``model.safetensors``: float32 weights drawn from ``numpy.random.default_rng(seed)`` (N(0, 0.02), norms 1);
- ``tokenizer.json``: a byte-level BPE trained with ``tokenizers`` on a small built-in corpus that holds the
  label words of the demo and the tests, padded with unreachable entries to exactly ``vocab_size`` (so every
  id the model can sample decodes);
- ``tokenizer_config.json``: the special tokens and a Llama-3-style chat template (system, then user, then
  the assistant header), so a prompt's stable prefix (the system message) comes first.

Same arguments, same bytes: the corpus is fixed, BPE training is deterministic and the weights come from a
seeded generator. ``weights=False`` writes everything but the weights, for ``load_format="dummy"`` (vLLM then
fills random weights itself: how ``benchmarks/vllm_gpu.py`` gets a Llama-3.1-8B-sized model without 16 GB of
files). Needs ``numpy``, ``safetensors`` and ``tokenizers`` (all installed with vLLM); no torch.

    python -m batch_pipeline.models.tiny_llama OUT_DIR [--seed 0]
"""

import argparse
import json
import random
from pathlib import Path

BOS = "<|begin_of_text|>"
EOS = "<|eot_id|>"
PAD = "<|pad|>"
SPECIAL_TOKENS = [BOS, EOS, PAD, "<|start_header_id|>", "<|end_header_id|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n{{ message['content'] }}<|eot_id|>"
    "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)

TINY = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 2048,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
}
# Llama-3.1-8B's shapes (the GPU benchmark); its 128256-entry vocab is kept so the lm_head costs what it costs.
LLAMA_3_1_8B = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
}

# Label words of the demo and the tests come first: each ends up a short token sequence.
LABELS = [
    "billing",
    "bug",
    "feature_request",
    "account",
    "other",
    "positive",
    "negative",
    "neutral",
    "urgent",
    "low",
    "high",
    "medium",
    "yes",
    "no",
    "true",
    "false",
    "null",
    "label",
    "priority",
]
WORDS = """
the a an and or but to of in on for with from by at as is are was were be been it this that these those
i you we they he she my your our their me us them not no please thanks thank hello hi dear team support
customer ticket invoice charge charged refund payment card bank statement price plan subscription seat
seats workspace admin login password reset email address phone two factor authentication code access
locked out account profile user users page app mobile desktop browser error crash broken slow timeout
fails failed failing cannot can't could would should will need needs want wants add feature request
export import report dashboard chart api key token limit upload download file files folder share sharing
team members invite role permission settings update updated version release today yesterday week month
year morning evening since after before when while still again every each all some many more most less
help issue problem question answer reply email chat phone channel hours minutes days number amount total
vat tax receipt billing cycle annual monthly upgrade downgrade cancel cancelled confirm correct corrected
missing wrong double twice duplicate extra fee discount coupon trial free paid pro enterprise business
label one only exactly set allowed answer classify classification category categories following text
system user assistant json object string boolean integer array property value field schema valid
good bad fine great terrible happy unhappy love hate like dislike fast works working worked nice
""".split()
PUNCT = [".", ",", "?", "!", ":", ";", "-", "(", ")", '"', "'", "/", "{", "}", "[", "]", "_", "#", "@", "%"]


def corpus(lines: int = 4000) -> list[str]:
    """The fixed training text (seeded; independent of the model seed so the tokenizer never changes)."""
    rng = random.Random(20240101)
    words = LABELS * 6 + WORDS
    out = [" ".join(LABELS), json.dumps({"label": "billing", "urgent": True, "priority": 3})]
    for label in LABELS:
        out.append(json.dumps({"label": label}))
        out.append(f'{{"label":"{label}","urgent":false}}')
    for i in range(lines):
        n = rng.randint(4, 18)
        sentence = " ".join(rng.choice(words) for _ in range(n))
        if i % 3 == 0:
            sentence = sentence.capitalize()
        out.append(sentence + rng.choice(PUNCT[:4]) + (f" {rng.randint(0, 99999)}" if i % 5 == 0 else ""))
    return out


def build_tokenizer(vocab_size: int):
    """A byte-level BPE with the special tokens at ids 0-4, padded to exactly ``vocab_size`` ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=min(vocab_size, 4096),
        min_frequency=2,
        show_progress=False,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    if len(vocab) > vocab_size:
        raise ValueError(f"vocab_size {vocab_size} is smaller than the trained vocabulary ({len(vocab)})")
    for i in range(len(vocab), vocab_size):  # unreachable by merges; they only make every id decodable
        vocab[f"<|reserved_{i}|>"] = i
    return Tokenizer.from_str(json.dumps(data))


def llama_config(dims: dict, bos_id: int, eos_id: int, pad_id: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "use_cache": True,
        "dtype": "float32",
        "torch_dtype": "float32",
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "transformers_version": "5.0.0",
        **dims,
    }  # (an older or absent version makes transformers guess)


def _weights(dims: dict, seed: int) -> dict:
    import numpy as np

    rng = np.random.default_rng(seed)
    h, inter, vocab = dims["hidden_size"], dims["intermediate_size"], dims["vocab_size"]
    hd, nh, nkv = dims["head_dim"], dims["num_attention_heads"], dims["num_key_value_heads"]

    def normal(*shape: int):
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)).astype(np.float32)

    w = {"model.embed_tokens.weight": normal(vocab, h)}
    for i in range(dims["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "self_attn.q_proj.weight"] = normal(nh * hd, h)
        w[p + "self_attn.k_proj.weight"] = normal(nkv * hd, h)
        w[p + "self_attn.v_proj.weight"] = normal(nkv * hd, h)
        w[p + "self_attn.o_proj.weight"] = normal(h, nh * hd)
        w[p + "mlp.gate_proj.weight"] = normal(inter, h)
        w[p + "mlp.up_proj.weight"] = normal(inter, h)
        w[p + "mlp.down_proj.weight"] = normal(h, inter)
        w[p + "input_layernorm.weight"] = np.ones(h, np.float32)
        w[p + "post_attention_layernorm.weight"] = np.ones(h, np.float32)
    w["model.norm.weight"] = np.ones(h, np.float32)
    w["lm_head.weight"] = normal(vocab, h)
    return w


def build_tiny_llama(out_dir: str | Path, seed: int = 0, *, weights: bool = True, **dims) -> Path:
    """Write the model directory (config, weights, tokenizer, chat template); returns its path.

    ``dims`` override the ``TINY`` shapes (e.g. ``**LLAMA_3_1_8B`` with ``weights=False``).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shape = {**TINY, **dims}
    unknown = set(shape) - set(TINY)
    if unknown:
        raise ValueError(f"unknown model dimensions: {sorted(unknown)}")
    tok = build_tokenizer(shape["vocab_size"])
    bos, eos, pad = tok.token_to_id(BOS), tok.token_to_id(EOS), tok.token_to_id(PAD)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": BOS,
                "eos_token": EOS,
                "pad_token": PAD,
                "add_bos_token": False,
                "add_eos_token": False,
                "clean_up_tokenization_spaces": False,
                "model_max_length": shape["max_position_embeddings"],
                "chat_template": CHAT_TEMPLATE,
            },
            indent=1,
        )
    )
    (out / "special_tokens_map.json").write_text(json.dumps({"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}))
    (out / "config.json").write_text(json.dumps(llama_config(shape, bos, eos, pad), indent=1, sort_keys=True))
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad}, sort_keys=True)
    )
    if weights:
        from safetensors.numpy import save_file

        save_file(_weights(shape, seed), str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description="Build the tiny random-weight Llama (no download).")
    parser.add_argument("out_dir", help="directory to write the model into")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    path = build_tiny_llama(args.out_dir, seed=args.seed)
    print(path)
    return path


if __name__ == "__main__":
    main()
