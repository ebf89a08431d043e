"""OpenAI's BPE encodings (o200k_base, cl100k_base) from the rank files shipped in ``bpe_ranks/``, checked
against tiktoken's published SHA-256 and never downloaded. One loader for the pipeline's quote (``core/money``) and
the sandbox's billing (``sandbox/tokens.py``, through ``counter``), which must count alike; a leaf module, so both may
import it."""

import binascii
import gzip
import hashlib
import re
from collections.abc import Callable, Sequence
from contextlib import suppress
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


# Where o200k's split cannot join two sides: a space with a non-space after it. None of the split pattern's
# alternatives holds a space anywhere but first, except the whitespace runs, which the non-space after it ends (and
# ``\s+(?!\S)`` then stops before it); the pattern looks neither behind nor at the text's start. So a text's pieces
# are the pieces of its chunks, each chunk counted alone. ``str.isspace`` holds every Unicode White_Space character
# that the pattern's ``\s`` does (and ``\x1c``-``\x1f`` besides): a boundary it misses only merges two chunks.
_SPACE_THEN_WHITESPACE = re.compile(r" (?:\s|\Z)")
_BOUNDARY = re.compile(r" (?=\S)")  # a space before a non-space: ``\S`` is ``not str.isspace()``, as above
JOINED_SPACE = "\ue000"  # a private-use character: a space that is no boundary, while Arrow splits at the others
COUNT_MANY_SLICE = 2048  # texts split and looked up at once: ~2 MB of prompts, their chunks' arrays a few times that
CHUNK_COUNTS_KEPT = 500_000  # ~50 MB of short words; past it the cache starts again
CHUNK_MAX_CHARS = 64  # a longer chunk (no spaces: code, CJK, base64) is counted, not kept
# A text whose chunks are mostly new (IDs, numbers, another language's words) is counted in one BPE pass: a call per
# word cost 1.5-2.7x tiktoken's pass on text of unique words. It still teaches the cache a few of its chunks, so
# prose, whose words recur, soon takes the cached path after a cold start.
MOSTLY_NEW = 4  # more than a quarter of the chunks not seen
LEARNED_PER_TEXT = 8


class ChunkCounter:
    """Exact ``o200k_base`` token counts, cached by chunk (a space and the word after it): natural text repeats its
    words, so a 900-character prompt is ~150 lookups rather than a BPE pass. The counts are tiktoken's (each chunk
    encoded alone), checked against it on adversarial text in ``test_bpe.py``."""

    def __init__(self, encode: Callable[[str], list[int]]):
        self._encode = encode
        self._counts: dict[str, int] = {}  # a chunk after its leading space -> the tokens of " " + chunk
        self._firsts: dict[str, int] = {}  # a text's first chunk (no space before it) -> its tokens

    def __call__(self, text: str) -> int:
        chunks = text.split(" ")  # the first has no leading space; each other one follows a space
        if len(chunks) > 1 and _SPACE_THEN_WHITESPACE.search(text):
            chunks = _BOUNDARY.split(text)  # the spaces that are boundaries only
        found = list(map(self._counts.get, chunks))
        missing = found.count(None)
        if missing * MOSTLY_NEW > len(found):  # mostly words not seen: one BPE pass beats one per word
            self._learn(chunks, found, LEARNED_PER_TEXT)
            return len(self._encode(text))
        found[0] = len(self._encode(chunks[0]))
        self._learn(chunks, found, missing)
        return sum(found)  # type: ignore[arg-type]  # every None counted by _learn

    def _learn(self, chunks: list[str], found: list[int | None], limit: int) -> None:
        """Count (and keep) the first ``limit`` chunks ``found`` lacks, in place: they are found by list scans
        rather than a Python loop over every chunk."""
        at = -1
        with suppress(ValueError):  # no None left after ``at``
            for _ in range(limit):
                at = found.index(None, at + 1)
                found[at] = self._count(chunks[at])

    def _count(self, chunk: str) -> int:
        n = 1 + _digit_tokens(chunk) if chunk.isdigit() and chunk.isascii() else len(self._encode(" " + chunk))
        return _kept(self._counts, chunk, n)

    def _first(self, chunk: str) -> int:
        """A text's first chunk counted (and kept: texts of one kind start alike, "Ticket", "Review", "The")."""
        n = _digit_tokens(chunk) if chunk.isdigit() and chunk.isascii() else len(self._encode(chunk))
        return _kept(self._firsts, chunk, n)

    def count_many(self, texts: Sequence[str]) -> list[int]:
        """``[self(t) for t in texts]``, a slice of texts at a time column-wise: Arrow splits them into chunks and
        finds the distinct ones, so a chunk that recurs across the slice (a batch's prompts share most of their
        words) is looked up in the cache once rather than at each occurrence. A slice that is mostly new words, or
        that Arrow cannot hold, is counted text by text."""
        counts: list[int] = []
        for start in range(0, len(texts), COUNT_MANY_SLICE):
            part = texts[start : start + COUNT_MANY_SLICE]
            counted = self._count_slice(part)
            counts.extend(counted if counted is not None else map(self, part))
        return counts

    def _count_slice(self, texts: Sequence[str]) -> list[int] | None:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        pool = pa.system_memory_pool()  # malloc: the sandbox answers from a new thread each time, and mimalloc's
        # heaps per thread kept ~40 MB more of these slices than malloc did
        try:
            column = pa.array(texts, pa.string(), memory_pool=pool)
        except (pa.ArrowException, UnicodeError):  # a lone surrogate (JSON allows "\ud800"), which UTF-8 cannot hold
            return None
        column, order, alone = _with_joined_spaces(texts, column, pool)
        parts = pc.split_pattern(column, " ", memory_pool=pool)
        offsets = parts.offsets.to_numpy()
        chunks = parts.values
        starts = offsets[:-1] - offsets[0]
        later = np.ones(len(chunks), dtype=np.bool_)
        later[starts] = False  # every text has a first chunk ("" for an empty text)
        encoded = pc.dictionary_encode(pc.filter(chunks, pa.array(later), memory_pool=pool), memory_pool=pool)
        distinct = _spaces_back(encoded.dictionary, order is not None)
        known = list(map(self._counts.get, distinct))
        if known.count(None) * MOSTLY_NEW > len(encoded):  # mostly new words: one BPE pass per text is cheaper
            return None
        self._learn(distinct, known, len(known))
        per_chunk = np.asarray(known, dtype=np.int64)[encoded.indices.to_numpy()]
        running = np.concatenate(([0], np.cumsum(per_chunk)))
        # text i's later chunks start where its chunks do, less the i first chunks dropped before them
        bounds = offsets - offsets[0] - np.arange(len(column) + 1)
        sums = (running[bounds[1:]] - running[bounds[:-1]]).tolist()
        firsts = _spaces_back(pc.take(chunks, pa.array(starts), memory_pool=pool), order is not None)
        first_counts = map(self._firsts.get, firsts)
        counts = [n + (f if f is not None else self._first(c)) for n, f, c in zip(sums, first_counts, firsts)]
        if order is None:
            return counts
        in_order = [0] * len(texts)
        for at, n in zip(order, counts):
            in_order[at] = n
        for at in alone:
            in_order[at] = self(texts[at])
        return in_order


def _kept(cache: dict[str, int], chunk: str, n: int) -> int:
    """``n``, kept in ``cache`` for ``chunk`` unless the chunk is long; a full cache starts again."""
    if len(chunk) <= CHUNK_MAX_CHARS:
        if len(cache) >= CHUNK_COUNTS_KEPT:
            cache.clear()
        cache[chunk] = n
    return n


def _digit_tokens(digits: str) -> int:
    """o200k's tokens of a run of ASCII digits: its split takes digits three at a time (``\\p{N}{1,3}``), and every
    string of one to three digits is one token (``test_bpe.py`` checks all 1,110). A space before the run is a token
    of its own. Numbers (order IDs, references) are most of the chunks a cache of prose has not seen: no BPE call."""
    return -(-len(digits) // 3)


def _with_joined_spaces(texts: Sequence[str], column, pool):  # noqa: ANN001, ANN202 (pyarrow: imported when counting)
    """``column`` ready for a split at its spaces, (column, order, alone): the texts with a space that is no
    boundary (before other whitespace, or at the end: ~2% of prose, a quarter of some) moved to the end with each
    such space replaced by ``JOINED_SPACE``. ``order``: each row's index in ``texts`` (None when nothing moved);
    ``alone``: the texts holding ``JOINED_SPACE`` themselves, left out, to be counted one by one."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    special_re2, non_boundary_re2 = _re2_patterns()
    special = pc.match_substring_regex(column, special_re2, memory_pool=pool)
    is_special = special.to_numpy(zero_copy_only=False)
    marked = np.flatnonzero(is_special).tolist()
    if not marked:
        return column, None, []
    alone = [at for at in marked if JOINED_SPACE in texts[at]]
    moved = [at for at in marked if JOINED_SPACE not in texts[at]] if alone else marked
    joined = pc.take(column, pa.array(moved, pa.int64()), memory_pool=pool)
    for _ in range(2):  # a match takes the character after its space, so a run is done every other space at first
        joined = pc.replace_substring_regex(joined, non_boundary_re2, JOINED_SPACE + "\\1", memory_pool=pool)
    regular = pc.filter(column, pc.invert(special, memory_pool=pool), memory_pool=pool)
    order = np.flatnonzero(~is_special).tolist() + moved
    return pa.concat_arrays([regular, joined], memory_pool=pool), order, alone


def _spaces_back(chunks, joined: bool) -> list[str]:  # noqa: ANN001 (a pyarrow string array)
    """``chunks`` as Python strings, each ``JOINED_SPACE`` a space again (found by Arrow: only a moved text's
    chunks hold one)."""
    values = chunks.to_pylist()
    if joined:
        import numpy as np
        import pyarrow.compute as pc

        for at in np.flatnonzero(pc.match_substring(chunks, JOINED_SPACE).to_numpy(zero_copy_only=False)).tolist():
            values[at] = values[at].replace(JOINED_SPACE, " ")
    return values


@cache
def _re2_patterns() -> tuple[str, str]:
    """In RE2 (Arrow's regex engine), whose ``\\s`` is ASCII only, so its class names every character
    ``str.isspace`` holds: a text to move (``_SPACE_THEN_WHITESPACE``, or a ``JOINED_SPACE`` of its own), and the
    spaces ``_with_joined_spaces`` replaces. Built when a batch is first counted: the scan of every code point takes
    ~0.1 s, too much for each process that imports this."""
    whitespace = "".join(f"\\x{{{c:x}}}" for c in range(0x110000) if chr(c).isspace())
    return f" (?:[{whitespace}]|$)|{JOINED_SPACE}", f" ([{whitespace}{JOINED_SPACE}]|$)"


@cache
def counter(name: str) -> Callable[[str], int]:
    """Exact token count of a text under ``name``, for a long-lived process that counts many texts (the sandbox's
    billing): ``o200k_base`` by cached chunks (``ChunkCounter``), any other encoding by tiktoken directly (its split
    pattern was not checked for chunk boundaries). The quote counts its 2,048-prompt sample with tiktoken: in a
    fresh process the cache would only be filling."""
    encode = encoding(name).encode_ordinary
    if name == "o200k_base":
        return ChunkCounter(encode)
    return lambda text: len(encode(text))
