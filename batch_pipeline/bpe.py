"""OpenAI's BPE encodings (o200k_base, cl100k_base) from the rank files shipped in ``bpe_ranks/``, checked
against tiktoken's published SHA-256 and never downloaded. One loader for the pipeline's quote (``core/money``) and
the sandbox's billing (``sandbox/tokens.py``), which must count alike; a leaf module, so both may import it."""

import binascii
import gzip
import hashlib
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


RANKS = Path(__file__).parent / "bpe_ranks"  # the rank files, shipped with the package (bpe_ranks/README.md)


class BundledRanksError(RuntimeError):
    """The bundled rank file is missing or does not match its published hash: reinstall batch-pipeline."""


@cache
def encoding(name: str) -> tiktoken.Encoding:
    digest, pattern = BPE[name]
    path = RANKS / f"{name}.tiktoken.gz"
    if not path.is_file():
        raise BundledRanksError(f"{path} is missing; reinstall batch-pipeline")
    raw = gzip.decompress(path.read_bytes())
    if hashlib.sha256(raw).hexdigest() != digest:
        raise BundledRanksError(
            f"the bundled {name} ranks do not match tiktoken's published hash; reinstall batch-pipeline"
        )
    # "<base64 token> <rank>" lines, their content fixed by the hash above: one split and binascii read o200k's in
    # 0.10 s, against 0.15 s for a split per line and base64.b64decode's checks (tiktoken's build is another 0.13 s)
    fields = raw.split()
    ranks = dict(zip(map(binascii.a2b_base64, fields[0::2]), map(int, fields[1::2]), strict=True))
    return tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
