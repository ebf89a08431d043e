"""Whitespace normalisation and request IDs, defined once.

Engines disagree on what ``\\s`` means (Python's ``str.split`` counts the ASCII separators
``\\x1c``-``\\x1f``; RE2 counts only ASCII; Rust's regex counts Unicode White_Space). We define the set
explicitly as the Unicode ``White_Space`` property and use it in every implementation, so a
vectorised path and the plain-Python reference produce byte-identical text and therefore identical IDs.

``request_id = sha256(prompt_version | model | settings fingerprint | normalised rendered input)`` as 64
hex characters, which also fits Anthropic's ``custom_id`` pattern ``^[a-zA-Z0-9_-]{1,64}$``.
"""

import hashlib
import re

# Unicode White_Space (PropList.txt): the set every normaliser in this package uses.
WHITESPACE_CHARS = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680"
    "\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)
_CLASS = "[" + "".join(f"\\u{ord(c):04x}" for c in WHITESPACE_CHARS) + "]"
_NON_SPACE_CLASS = "[" + "".join(f"\\u{ord(c):04x}" for c in WHITESPACE_CHARS if c != " ") + "]"
# Only runs that are not already a single ASCII space need rewriting: most text never matches.
# The pattern uses only \\uHHHH escapes, so Rust's regex (Polars) and Python's re read it the same way.
ABNORMAL_WHITESPACE = f"{_CLASS}{{2,}}|{_NON_SPACE_CLASS}"
_ABNORMAL = re.compile(ABNORMAL_WHITESPACE)
_STRIP = WHITESPACE_CHARS
ID_SEPARATOR = "\x1f"


def normalize_text(text: str) -> str:
    """Collapse every run of Unicode whitespace to one ASCII space and strip both ends."""
    return _ABNORMAL.sub(" ", text).strip(_STRIP)


def id_prefix(prompt_version: str, model: str, settings_fingerprint: str) -> bytes:
    return ID_SEPARATOR.join((prompt_version, model, settings_fingerprint, "")).encode()


def request_id(prefix: bytes, rendered_input: str) -> str:
    h = hashlib.sha256(prefix)
    h.update(rendered_input.encode("utf-8"))
    return h.hexdigest()


def request_ids(prefix: bytes, rendered_inputs: list[str] | list[bytes]) -> list[str]:
    """Many IDs at once: the prefix is hashed once and the state copied per row.

    Takes the rendered inputs as text or as their UTF-8 bytes (what Polars hands over from a ``Binary``
    cast without decoding); both give the same IDs.
    """
    base = hashlib.sha256(prefix)
    copy = base.copy
    out = []
    append = out.append
    if rendered_inputs and isinstance(rendered_inputs[0], bytes):
        for data in rendered_inputs:
            h = copy()
            h.update(data)
            append(h.hexdigest())
        return out
    for text in rendered_inputs:
        h = copy()
        h.update(text.encode("utf-8"))
        append(h.hexdigest())
    return out


# A pass that reads another job's answers (``input.from_job``) hashes the upstream answer with the rendered input,
# so a changed upstream answer makes a new request for that row only, shown in the template or not.
UPSTREAM_OUTPUT = "_upstream_output"


def with_upstream(rendered_input: str, upstream_output: str) -> str:
    """What a downstream pass's request ID hashes (the vectorised path in ``prepare`` builds the same text)."""
    return rendered_input + ID_SEPARATOR + upstream_output
