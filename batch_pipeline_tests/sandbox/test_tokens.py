"""The sandbox's per-piece BPE counts equal tiktoken's whole-text counts, on text built to disagree if they can."""

import random

import pytest

from batch_pipeline.bpe import encoding
from batch_pipeline.sandbox import tokens
from batch_pipeline.sandbox.tokens import PieceCounts, input_tokens

HARD = [
    "Hello world! It's a test, isn't it? We'll see; they'd've said THEY'RE here.",
    "Numbers: 1 12 123 1234 12345678 3.14159 -42 1e10 0x1F",
    "Accents: café naïve résumé Ærøskøbing façade; Greek: καλημέρα; Cyrillic: Привет мир",
    "CJK: 日本語のテキスト 中文文本 한국어 텍스트; emoji: 👍🏽 🇫🇷 👨‍👩‍👧 ✨",
    "Arabic: مرحبا بالعالم; Hebrew: שלום עולם; Devanagari: नमस्ते दुनिया",
    "Whitespace:  two  spaces\tTab\t\ttabs\n\nnewlines\r\nCRLF\r\n\r\n  \n trailing   ",
    "Odd spaces:\xa0nbsp\u2028line sep\u2029para sep\u3000ideographic\u200bzero-width",
    "Punctuation runs: ...!!! ??? --- ''' \"\"\" /// ((( ))) [[[ ]]] {{{ }}} <<<>>> ~~~ ### $$$ %%%",
    "Code: def f(x):\n    return x**2 + y_1 // 3  # comment\n\tif a != b: print('ok')\n",
    "MixedCASE wordsLikeThis camelCase snake_case SCREAMING_CASE Title Case O'Neil McDonald's",
    "",
    " ",
    "\n",
    "a",
]


def _random_texts(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    alphabet = "abcdeéñßøçABCZ0123456789 \t\n\r.,;:'\"!?-_/()[]{}日本한👍\xa0\u2028"
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 400))) for _ in range(n)]


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base"])
def test_piece_counts_equal_the_whole_text_count(name):
    counts, enc = PieceCounts(name), encoding(name)
    for text in HARD + _random_texts(7, 300):
        assert counts(text) == len(enc.encode_ordinary(text)), repr(text)
    assert counts(HARD[0] * 3) == len(enc.encode_ordinary(HARD[0] * 3))  # again, from the kept pieces


def test_the_kept_pieces_stay_bounded_and_the_counts_stay_exact(monkeypatch):
    monkeypatch.setattr(tokens, "PIECES_KEPT", 50)
    counts, enc = PieceCounts("o200k_base"), encoding("o200k_base")
    for text in _random_texts(11, 200):
        assert counts(text) == len(enc.encode_ordinary(text))
        assert len(counts.counts) <= 50 + len(text)  # cleared once past the bound, then one text's pieces at most


def test_billed_input_scales_by_family():
    text = HARD[2]
    base = len(encoding("o200k_base").encode_ordinary(text))
    assert input_tokens(text, "gpt-4o-mini") == base
    assert input_tokens(text, "claude-3-5-haiku") == -(-base * 125 // 100)
    assert input_tokens(text, "llama-3.1-8b") == len(encoding("cl100k_base").encode_ordinary(text))
    assert input_tokens("", "gpt-4o-mini") == 0
