"""``batch_pipeline.bpe.counter``: the chunk-cached o200k count equals tiktoken's on any text, and its cache stays
bounded."""

import random

import pytest

from batch_pipeline import bpe

# every kind of character o200k's split pattern tells apart: ASCII and Unicode whitespace (and \x1c, which Python
# calls whitespace and the pattern does not), upper, lower, title-case, modifier and other letters, combining
# marks, decimal and other numbers, punctuation, contractions, slashes, emoji
PIECES = [
    " ", " ", " ", "  ", "\t", "\n", "\r", "\r\n", "\xa0", "\u2028", "\u3000", "\x1c", "\x85",
    "word", "Word", "WORD", "wOrD", "é", "École", "ǅemal", "ʰa", "ªb", "中文", "e\u0301", "\u0301",
    "7", "2026", "1234567", "²", "½", "Ⅻ",
    ".", ",", ";", "!?", "...", "'", "'s", "'LL", "'ve", "/", "//", "-", "_", "😀", "(x)", "\"q\"",
]  # fmt: skip


def _texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(PIECES) for _ in range(rng.randint(0, 40))) for _ in range(n)]


@pytest.mark.parametrize("mostly_new", [bpe.MOSTLY_NEW, 0], ids=["as_shipped", "never_one_pass"])
def test_the_chunk_count_is_tiktokens_on_every_kind_of_text(monkeypatch, mostly_new):
    monkeypatch.setattr(bpe, "MOSTLY_NEW", mostly_new)  # 0: every text counted chunk by chunk, however new
    encode = bpe.encoding("o200k_base").encode_ordinary
    count = bpe.ChunkCounter(encode)  # a fresh cache: the first pass fills it, the second reads it
    texts = _texts(20_000, seed=1)
    expected = [len(encode(t)) for t in texts]
    assert [count(t) for t in texts] == expected
    assert [count(t) for t in texts] == expected
    assert count("") == 0


def test_prose_is_counted_from_the_cache_and_exactly():
    encode = bpe.encoding("o200k_base").encode_ordinary
    count = bpe.ChunkCounter(encode)
    prose = ("The quick brown fox's tail, 12 cm long, isn't WHITE: it is red/brown. " * 20).strip()
    assert count(prose) == len(encode(prose))
    assert " quick" not in count._counts and "quick" in count._counts  # kept by the word after its space
    assert count(prose + " ") == len(encode(prose + " "))  # a trailing space joins the last chunk


def test_the_cache_is_bounded_and_a_long_chunk_is_not_kept(monkeypatch):
    encode = bpe.encoding("o200k_base").encode_ordinary
    monkeypatch.setattr(bpe, "CHUNK_COUNTS_KEPT", 50)
    monkeypatch.setattr(bpe, "MOSTLY_NEW", 0)
    count = bpe.ChunkCounter(encode)
    texts = _texts(2_000, seed=2)
    assert [count(t) for t in texts] == [len(encode(t)) for t in texts]
    assert len(count._counts) <= 50
    long_chunk = "x" * (bpe.CHUNK_MAX_CHARS + 1)
    assert count("a " + long_chunk) == len(encode("a " + long_chunk))
    assert long_chunk not in count._counts


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base"])
def test_counter_is_one_per_encoding_and_counts_as_tiktoken(name):
    encode = bpe.encoding(name).encode_ordinary
    assert bpe.counter(name) is bpe.counter(name)
    texts = _texts(500, seed=3)
    assert [bpe.counter(name)(t) for t in texts] == [len(encode(t)) for t in texts]


def _counting(encode):
    """``encode``, recording each text it is asked for (what the counter still hands to BPE)."""
    calls: list[str] = []

    def wrapped(text: str) -> list[int]:
        calls.append(text)
        return encode(text)

    return wrapped, calls


def test_recurring_words_are_counted_from_the_cache_and_new_ones_in_one_pass():
    encode = bpe.encoding("o200k_base").encode_ordinary
    wrapped, calls = _counting(encode)
    count = bpe.ChunkCounter(wrapped)
    words = "the ticket says my order never arrived and support did not answer".split()
    rng = random.Random(4)
    prose = [" ".join(rng.choice(words) for _ in range(60)) for _ in range(50)]
    assert [count(t) for t in prose] == [len(encode(t)) for t in prose]
    calls.clear()
    text = " ".join(rng.choice(words) for _ in range(60))
    assert count(text) == len(encode(text))
    assert calls == [text.split(" ")[0]]  # only the first chunk, which has no leading space, went to BPE
    # unique words (IDs, numbers): one pass over the whole text, and a few of its chunks learned for the next ones
    ids = " ".join(f"{rng.getrandbits(40):x}" for _ in range(60))
    calls.clear()
    assert count(ids) == len(encode(ids))
    assert ids in calls and len(calls) == 1 + bpe.LEARNED_PER_TEXT


@pytest.mark.parametrize("mostly_new", [bpe.MOSTLY_NEW, 0], ids=["as_shipped", "never_one_pass"])
def test_a_slice_counted_column_wise_is_tiktokens_count_of_each_text(monkeypatch, mostly_new):
    """``count_many`` (Arrow's split and distinct chunks) on every kind of text: runs of spaces before other
    whitespace and at the end, which its first pass over a run leaves half done, and texts that share chunks."""
    monkeypatch.setattr(bpe, "MOSTLY_NEW", mostly_new)
    monkeypatch.setattr(bpe, "COUNT_MANY_SLICE", 1_000)  # several slices, the last one short
    encode = bpe.encoding("o200k_base").encode_ordinary
    texts = _texts(4_500, seed=5) + ["", " ", "  ", "a  ", "   b", "a \t b", "x" * 200 + " " + "y" * 70]
    expected = [len(encode(t)) for t in texts]
    count = bpe.ChunkCounter(encode)
    assert count.count_many(texts) == expected  # a cold cache
    assert count.count_many(texts[::-1]) == expected[::-1]  # a warm one
    assert count.count_many([]) == []


def test_texts_arrow_cannot_split_are_counted_one_by_one():
    """A lone surrogate (JSON allows ``"\\ud800"``; UTF-8 cannot hold it): that slice is counted text by text. A
    text holding the private-use character that stands for a joined space is counted alone, and the rest of its
    slice column-wise. Each count still exact."""
    encode = bpe.encoding("o200k_base").encode_ordinary
    wrapped, calls = _counting(encode)
    count = bpe.ChunkCounter(wrapped)
    prose = ["the order never arrived and support did not answer"] * 20
    for odd in ("x \ud800 y", "a \ue000  b  ", "  "):
        texts = [*prose, odd]
        assert count.count_many(texts) == [len(encode(t)) for t in texts] == [count(t) for t in texts]
    calls.clear()
    prose = [text.replace("the", "an", 1) for text in prose]
    assert count.count_many(prose) == [len(encode(t)) for t in prose]
    assert calls == ["an"]  # column-wise: the texts' new first chunk went to BPE once, and nothing else
    irregular = ["the order  never arrived", "support did not answer \n", "the order never arrived "]
    mixed = [*prose[:3], irregular[0], prose[0], *irregular[1:], *prose[:2]]
    calls.clear()
    assert count.count_many(mixed) == [len(encode(t)) for t in mixed]
    # the irregular texts were counted column-wise too, a joined space inside their chunks: only their new chunks
    # (a space after the word, and a first chunk) went to BPE
    assert sorted(calls) == [" answer \n", " arrived ", " order ", "support"]


def test_every_one_to_three_digit_string_is_one_o200k_token():
    """What the count of a run of digits relies on (``bpe._digit_tokens``): true of the shipped ranks."""
    encode = bpe.encoding("o200k_base").encode_ordinary
    assert all(len(encode(f"{i:0{n}d}")) == 1 for n in (1, 2, 3) for i in range(10**n))


def test_numbers_are_counted_without_bpe_and_exactly():
    """Order numbers, references, years and zero-padded IDs, alone and beside words and other digits (superscripts,
    Arabic-Indic digits, digits glued to letters or signs): each count is tiktoken's, and a chunk of ASCII digits
    goes to BPE neither after a space nor first in a text counted column-wise."""
    encode = bpe.encoding("o200k_base").encode_ordinary
    rng = random.Random(9)
    numbers = ["0", "7", "42", "007", "2026", "123456", "0000000001", "9" * 40, "\u0663\u0664", "\u00b2", "12a", "-5"]
    words = ["order", "ref", "Ticket", "x", "#", "no.", "\u00e9t\u00e9"]
    texts = [" ".join(rng.choice(numbers + words) for _ in range(rng.randint(1, 12))) for _ in range(3_000)]
    texts += [f"{rng.getrandbits(60)}" for _ in range(200)] + [f"ref {i}" for i in range(0, 10**6, 997)]
    expected = [len(encode(t)) for t in texts]
    wrapped, calls = _counting(encode)
    count = bpe.ChunkCounter(wrapped)
    assert count.count_many(texts) == expected
    # no number after a space went to BPE (a text that is one number alone may: a pass over a text of new chunks)
    assert not [c for c in calls if c[:1] == " " and c[1:].isdigit() and c.isascii()]
    assert [count(t) for t in texts] == expected
    calls.clear()
    firsts = [f"{rng.getrandbits(40)} was the order" for _ in range(3_000)]
    assert count.count_many(firsts) == [len(encode(t)) for t in firsts]
    assert not [c for c in calls if c.isdigit()]  # nor a number that starts a text, column-wise
