"""Reject reasons in plain English: what is wrong with a line, where, and the likely cause.

Python's JSON errors read as parser internals ("Unterminated string starting at" followed by our own "at column 35"
gave "starting at at column 35"); a person fixing an input file wants "a string that starts at column 35 never
ends". Every reader that turns a decode error into a reject (JSON lines, chat turns, OpenAI batch files) asks here.
"""

import json

# Python's json messages (CPython's json.decoder and _json), each as the sentence a person reads; {col} is the
# 1-based column the parser points at
_JSON_REASONS = {
    "Expecting value": "no value where one was expected at column {col}",
    "Expecting property name enclosed in double quotes": "expected a key in double quotes at column {col} (a trailing comma, or a key in single quotes?)",
    "Expecting ':' delimiter": "a colon is missing after the key, at column {col}",
    "Expecting ',' delimiter": "a comma is missing between two values, at column {col}",
    "Unterminated string starting at": "a string that starts at column {col} never ends (the line is cut off, or a closing quote is missing)",
    "Invalid control character at": "a raw control character (a tab or a line break) inside a string at column "
    "{col}; write it escaped (\\t, \\n)",
    "Invalid \\escape": "an invalid backslash escape at column {col} (a lone \\ must be written \\\\)",
    "Invalid \\uXXXX escape": "an invalid \\u escape at column {col} (\\u takes four hex digits)",
    "Extra data": "more text after the JSON value ends, at column {col} (two objects on one line?)",
}


def json_reason(exc: json.JSONDecodeError) -> str:
    """``bad JSON: <what is wrong, where>``; a line that stops inside a value says it looks cut off."""
    msg = exc.msg.removesuffix(" at").strip()
    template = _JSON_REASONS.get(exc.msg) or _JSON_REASONS.get(msg)
    if exc.pos >= len(exc.doc.rstrip()) and template and "{col} never ends" not in template:
        # the parser ran off the end of the line: whatever it expected next, the line is incomplete
        what = (
            f"the line ends at column {exc.colno} before the JSON value is complete (cut off?)"
            if exc.doc.strip()
            else "the line is empty"
        )
    elif template:
        what = template.format(col=exc.colno)
    else:
        what = f"{msg[:1].lower()}{msg[1:]} (column {exc.colno})"
    return f"bad JSON: {what}"


def json_type(value: object) -> str:
    """A JSON value's type as a person names it: ``a number``, not ``int``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
