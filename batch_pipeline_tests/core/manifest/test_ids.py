"""Whitespace normalisation and request IDs (core/manifest/ids.py) on their own.

The manifest normalises with Polars (Rust regex); ``ids.normalize_text`` is the plain-Python reference.
They must agree byte for byte, or the same text would get two request IDs depending on the path.
"""

import hashlib
import os
import re
import subprocess
import sys
import unicodedata

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from batch_pipeline.core.manifest import ids

ASCII_SEPARATORS = "\x1c\x1d\x1e\x1f"  # Python's str.isspace() says yes, Unicode White_Space says no
ALPHABET = sorted(set(ids.WHITESPACE_CHARS) | set(ASCII_SEPARATORS) | set("abZé.\u00ad\u200b"))
texts = st.text(alphabet=st.sampled_from(ALPHABET), max_size=40)


def polars_normalize(values: list[str]) -> list[str]:
    """Exactly the expression ManifestBuilder._prepare applies to every template field."""
    frame = pl.DataFrame({"t": values}, schema={"t": pl.String})
    out = frame.select(pl.col("t").str.replace_all(ids.ABNORMAL_WHITESPACE, " ").str.strip_chars(ids.WHITESPACE_CHARS))
    return out["t"].to_list()


# -- the whitespace set ------------------------------------------------------------------------
def test_whitespace_set_is_exactly_unicode_white_space():
    python_space = {c for c in map(chr, range(0x110000)) if c.isspace()}
    assert set(ASCII_SEPARATORS) <= python_space  # the documented disagreement really exists
    expected = python_space - set(ASCII_SEPARATORS)
    assert set(ids.WHITESPACE_CHARS) == expected
    assert len(ids.WHITESPACE_CHARS) == len(expected) == 25  # no duplicates in the constant


def test_ascii_separators_are_not_whitespace_in_either_path():
    text = "a\x1cb \x1d\x1e  c\x1f"
    assert ids.normalize_text(text) == "a\x1cb \x1d\x1e c\x1f"
    assert polars_normalize([text]) == [ids.normalize_text(text)]


def test_zero_width_and_soft_hyphen_are_kept():
    # U+200B (zero width space) and U+00AD are not White_Space: collapsing them would merge distinct texts
    assert ids.normalize_text("a\u200bb\u00adc") == "a\u200bb\u00adc"
    assert unicodedata.category("\u200b") == "Cf"


# -- normalize_text ----------------------------------------------------------------------------
def test_normalize_collapses_every_whitespace_kind():
    variants = [
        "hello world",
        "hello  world",
        "hello\tworld",
        "hello\xa0world",
        "hello\u2028world",
        "\n\nhello world\n",
        " \t\xa0hello \r\n\u3000 world\u2029\u0085",
        "hello\x0b\x0cworld",
    ]
    assert {ids.normalize_text(v) for v in variants} == {"hello world"}
    assert ids.normalize_text("hello world") != ids.normalize_text("helloworld")


@settings(max_examples=300, deadline=None)
@given(st.lists(texts, min_size=1, max_size=30))
def test_polars_path_agrees_with_python_reference(values):
    assert polars_normalize(values) == [ids.normalize_text(v) for v in values]


@settings(max_examples=300, deadline=None)
@given(texts)
def test_normalize_is_idempotent_and_canonical(text):
    once = ids.normalize_text(text)
    assert ids.normalize_text(once) == once
    # canonical form: no White_Space but single ASCII spaces between non-space runs, none at the ends
    ws = set(ids.WHITESPACE_CHARS)
    assert not once or (once[0] not in ws and once[-1] not in ws)
    assert "  " not in once
    assert all(c == " " or c not in ws for c in once)
    # and it only removed/replaced whitespace: the non-whitespace characters are unchanged and in order
    assert [c for c in once if c not in ws] == [c for c in text if c not in ws]


@settings(max_examples=200, deadline=None)
@given(texts)
def test_python_split_join_agrees_except_for_ascii_separators(text):
    """The sample generator's ``" ".join(s.split())`` is the same function on text without \\x1c-\\x1f."""
    cleaned = re.sub("[\x1c-\x1f]", "", text)
    assert ids.normalize_text(cleaned) == " ".join(cleaned.split())


# -- request IDs -------------------------------------------------------------------------------
def test_request_id_is_sha256_of_prefix_and_text_and_fits_custom_id_pattern():
    prefix = ids.id_prefix("v3", "gpt-4o-mini", "abcdef0123456789")
    rid = ids.request_id(prefix, "Ticket:\nhello")
    expected = hashlib.sha256(b"v3\x1fgpt-4o-mini\x1fabcdef0123456789\x1fTicket:\nhello").hexdigest()
    assert rid == expected
    assert re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", rid)


def test_batch_and_single_request_ids_agree():
    prefix = ids.id_prefix("v1", "m", "fp")
    inputs = ["a", "b", "", "ünïcödé \u2028", "a"]
    batch = ids.request_ids(prefix, inputs)
    assert batch == [ids.request_id(prefix, t) for t in inputs]
    assert batch[0] == batch[4] and len(set(batch)) == 4


def test_prefix_parts_cannot_be_shifted_into_each_other():
    # "v1" + "m2" vs "v1m" + "2": the separator keeps the fields apart
    a = ids.request_id(ids.id_prefix("v1", "m2", "fp"), "x")
    b = ids.request_id(ids.id_prefix("v1m", "2", "fp"), "x")
    c = ids.request_id(ids.id_prefix("v1", "m2fp", ""), "x")
    assert len({a, b, c}) == 3


def test_request_ids_are_stable_across_processes():
    """Another interpreter (different hash seed) computes the same IDs: nothing depends on hash()."""
    inputs = ["Ticket:\nhello world", "Ticket:\nCafé \u2028 ok", "x" * 5000]
    prefix = ids.id_prefix("v1", "gpt-4o-mini", "0123456789abcdef")
    code = (
        "import json, sys; from batch_pipeline.core.manifest import ids; "
        "inputs = json.loads(sys.stdin.read()); "
        "p = ids.id_prefix('v1', 'gpt-4o-mini', '0123456789abcdef'); "
        "print(json.dumps([ids.request_ids(p, inputs), [ids.normalize_text(t) for t in inputs]]))"
    )
    import json

    for seed in ("1", "987654"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        proc = subprocess.run(
            [sys.executable, "-c", code],
            input=json.dumps(inputs),
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=True,
        )
        their_ids, their_norm = json.loads(proc.stdout)
        assert their_ids == ids.request_ids(prefix, inputs)
        assert their_norm == [ids.normalize_text(t) for t in inputs]
