"""The tiny random-weight Llama: deterministic, complete (config, weights, tokenizer, chat template), no download."""

import hashlib
import json

from batch_pipeline.models.tiny_llama import build_tiny_llama, main

from .conftest import LABELS


def _digests(path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path, tiny_model):
    again = build_tiny_llama(tmp_path / "again", seed=0)
    assert _digests(again) == _digests(tiny_model)
    other = _digests(build_tiny_llama(tmp_path / "other", seed=1))
    assert other["model.safetensors"] != _digests(tiny_model)["model.safetensors"]
    assert other["tokenizer.json"] == _digests(tiny_model)["tokenizer.json"]  # the tokenizer does not depend on it


def test_shapes_tokenizer_and_chat_template(tiny_model):
    from transformers import AutoTokenizer  # installed with vLLM

    config = json.loads((tiny_model / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["head_dim"], config["vocab_size"]) == (
        128,
        2,
        64,
        2048,
    )
    tok = AutoTokenizer.from_pretrained(tiny_model)
    assert len(tok) == 2048  # every id the model can sample decodes
    for label in LABELS:
        ids = tok(label, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == label and len(ids) <= 3
    text = tok.apply_chat_template(
        [{"role": "system", "content": "SYSTEM"}, {"role": "user", "content": "USER"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert text.startswith("<|begin_of_text|>") and text.index("SYSTEM") < text.index("USER")
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert tok.eos_token == "<|eot_id|>" and tok.eos_token_id == config["eos_token_id"]


def test_cli_entry_builds_into_a_directory(tmp_path, capsys):
    path = main([str(tmp_path / "m"), "--seed", "3"])
    assert (path / "model.safetensors").exists() and str(path) in capsys.readouterr().out
