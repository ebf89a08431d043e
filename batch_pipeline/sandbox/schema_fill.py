"""Build a deterministic JSON value that validates against a (structured-outputs) JSON schema.

Supported: ``$ref`` into the same schema (``#/$defs/...``, ``#/definitions/...``), ``const``, ``enum``,
``anyOf``/``oneOf`` (first non-null branch), ``allOf`` (merged), ``type`` (one or a list), objects with
``properties``/``required``/``additionalProperties``, arrays with ``items``/``minItems``/``maxItems``/``uniqueItems``,
strings with ``minLength``/``maxLength``/common ``format``s, integers and numbers with bounds, booleans and null.
``pattern`` is not supported.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache
from itertools import islice
from typing import Any

from batch_pipeline.sandbox.ids import stable_hex

_WORD_SPLIT = re.compile(r"[_\s\-]+")
FORCE_LABEL_RE = re.compile(r"\[\[sandbox:label=([^\]]+)\]\]")
_ANY_MARKER_RE = re.compile(r"\[\[sandbox:\w+\]\]")
_WORD_RE = re.compile(r"\w+")
_MAX_DEPTH = 12
_FORMATS = {
    "date": "2024-01-01",
    "date-time": "2024-01-01T00:00:00Z",
    "time": "00:00:00",
    "email": "sandbox@example.com",
    "uri": "https://example.com/sandbox",
    "url": "https://example.com/sandbox",
    "uuid": "00000000-0000-4000-8000-000000000000",
}


def first_words(text: str, n: int, marker_re: re.Pattern[str] = _ANY_MARKER_RE) -> list[str]:
    """The first ``n`` words of ``text``, its ``[[sandbox:...]]`` markers left out: a scan of the head, not of a
    whole long prompt (splitting all of it into words was a visible share of the sandbox's CPU per request)."""
    if "[[sandbox:" in text:
        text = marker_re.sub(" ", text)
    return [m.group() for m in islice(_WORD_RE.finditer(text), n)]


def _is_word(char: str) -> bool:
    """``re``'s ``\\w`` for one character of a ``str``: alphanumeric in Unicode's sense, or ``_``."""
    return char.isalnum() or char == "_"


def _find_word(haystack: str, needle: str, whole: bool = True) -> int | None:
    """Position of ``needle`` as a whole word (or a word's start) in ``haystack`` (both lower case), or None: the
    first occurrence with no word character before it (nor, if ``whole``, after it), as ``(?<!\\w)needle(?!\\w)``
    finds it. Each occurrence is found by ``str.find`` and its two neighbours looked at: most labels are not in
    most texts, and the regex scan of a long prompt ran ~17 times per request, then cost ~10 us each time."""
    at = haystack.find(needle)
    while at >= 0:
        end = at + len(needle)
        if not (at and _is_word(haystack[at - 1])) and not (whole and end < len(haystack) and _is_word(haystack[end])):
            return at
        at = haystack.find(needle, at + 1)
    return None


_HINT_RE = re.compile(r"\b([A-Za-z][\w-]*)\s*\(([^()]{1,300})\)")


def label_hints(instructions: str) -> dict[str, list[str]]:
    """``label (word, word, ...)`` descriptions in a system prompt, as lower-case stems per label (a batch's lines
    share their instructions: found once, ``_cached_hints``; the result is read, never changed)."""
    return _cached_hints(instructions or "")


@lru_cache(maxsize=64)
def _cached_hints(instructions: str) -> dict[str, list[str]]:
    hints: dict[str, list[str]] = {}
    for label, words in _HINT_RE.findall(instructions):
        stems = [w.lower()[:6] for w in re.findall(r"[A-Za-z]{3,}", words)]
        if stems:
            hints.setdefault(label, []).extend(stems)
    return hints


def _hint_score(stems: list[str], lowered: str) -> tuple[int, int]:
    """(how many hint stems start a word of the text, earliest such position)."""
    hits, first = 0, len(lowered)
    for stem in stems:
        position = _find_word(lowered, stem, whole=False)
        if position is not None:
            hits += 1
            first = min(first, position)
    return hits, first


def pick_label(options: list[Any], text: str, salt: str = "", hints: dict[str, list[str]] | None = None) -> Any:
    """Choose one of ``options`` for a message ``text``.

    A label whose text occurs in the message (case-insensitive, whole words) wins; failing that, a label all of
    whose words (split on ``_``, ``-`` or spaces) occur. Ties go to the earliest occurrence, then the longer label.
    Otherwise the choice is a hash of the text.
    """
    if not options:
        raise ValueError("enum without values")
    # scenarios skew_labels / wrong_labels steer the answer through this marker; the first one naming one of the
    # options wins, so one text can steer two questions (a label, then a judge's pass/fail on the same task)
    for wanted in FORCE_LABEL_RE.findall(text) if "[[sandbox:label=" in text else ():
        if wanted in options:
            return wanted
        others = [o for o in options if o != wanted.removeprefix("not:")]
        if wanted.startswith("not:") and others:
            return others[int(stable_hex(text, salt, length=12), 16) % len(others)]
    lowered = text.lower()
    if hints:  # the instructions describe the labels: the label whose description the text matches best
        scored = []
        for i, option in enumerate(options):
            hits, first = _hint_score(hints.get(str(option), []), lowered)
            named = _find_word(lowered, str(option).lower().replace("_", " ")) is not None
            scored.append((-(hits + named), first, i))
        top = min(scored)
        if top[0] < 0:
            return options[top[2]]
    best: tuple[int, int, int, int] | None = None
    for index, option in enumerate(options):
        if not isinstance(option, str) or not option.strip():
            continue
        label, words = _label_words(option)
        position = _find_word(lowered, label)
        tier = 0
        if position is None:
            if words == (label,):  # one word, just not found: its words are not either
                continue
            found = [_find_word(lowered, w) for w in words]
            if not words or any(p is None for p in found):
                continue
            position = min(p for p in found if p is not None)
            tier = 1
        key = (tier, position, -len(label), index)
        if best is None or key < best:
            best = key
    if best is not None:
        return options[best[3]]
    return options[int(stable_hex(text, salt, length=12), 16) % len(options)]


@lru_cache(maxsize=4096)
def _label_words(option: str) -> tuple[str, tuple[str, ...]]:
    """An option lower-cased and its words (split on ``_``, ``-`` or spaces): a batch asks about the same labels
    on every line."""
    label = option.lower()
    return label, tuple(w for w in _WORD_SPLIT.split(label) if w)


def _resolve(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    """Follow local ``$ref``s (JSON pointers into ``root``)."""
    seen = 0
    while isinstance(schema, dict) and isinstance(schema.get("$ref"), str):
        ref = schema["$ref"]
        if not ref.startswith("#"):
            raise ValueError(f"only local $ref is supported, got {ref!r}")
        target: Any = root
        for part in [p for p in ref[1:].split("/") if p]:
            target = target[part.replace("~1", "/").replace("~0", "~")]
        extra = {k: v for k, v in schema.items() if k != "$ref"}
        schema = {**target, **extra}
        seen += 1
        if seen > 50:
            raise ValueError("$ref cycle")
    return schema


def _merge_all_of(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    merged = {k: v for k, v in schema.items() if k != "allOf"}
    for part in schema["allOf"]:
        part = _resolve(part, root)
        for key, value in part.items():
            if key == "properties":
                merged["properties"] = {**merged.get("properties", {}), **value}
            elif key == "required":
                merged["required"] = list(dict.fromkeys([*merged.get("required", []), *value]))
            else:
                merged.setdefault(key, value)
    return merged


def _schema_type(schema: dict[str, Any]) -> str:
    declared = schema.get("type")
    if isinstance(declared, list):
        non_null = [t for t in declared if t != "null"]
        return non_null[0] if non_null else "null"
    if isinstance(declared, str):
        return declared
    if "properties" in schema or "additionalProperties" in schema:
        return "object"
    if "items" in schema:
        return "array"
    return "string"


class SchemaFiller:
    """Fills schemas for one message text; every choice is a function of the text and the value's path."""

    def __init__(self, root: dict[str, Any], text: str, hints: dict[str, list[str]] | None = None) -> None:
        self.hints = hints
        self.root = root
        self.text = text
        self._snippet: str | None = None

    @property
    def snippet(self) -> str:
        """The text's first words, found when a value needs them (an enum-only schema never does)."""
        if self._snippet is None:
            self._snippet = " ".join(first_words(self.text, 6)) or "sandbox"
        return self._snippet

    def fill(self, schema: Any = None, path: str = "$", depth: int = 0) -> Any:
        """A value for ``schema`` (the root schema when omitted)."""
        if schema is None:
            schema = self.root
        if schema is True or schema == {}:
            return self.snippet
        if depth > _MAX_DEPTH:
            return None
        schema = _resolve(schema, self.root)
        if "allOf" in schema:
            schema = _merge_all_of(schema, self.root)
        if "const" in schema:
            return schema["const"]
        if isinstance(schema.get("enum"), list):
            return pick_label(schema["enum"], self.text, path, self.hints)
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), list) and schema[key]:
                branches = [_resolve(b, self.root) for b in schema[key]]
                chosen = next((b for b in branches if b.get("type") != "null"), branches[0])
                return self.fill(chosen, path, depth + 1)
        kind = _schema_type(schema)
        handler = getattr(self, f"_fill_{kind}", None)
        if handler is None:
            raise ValueError(f"unsupported schema type {kind!r} at {path}")
        return handler(schema, path, depth)

    def _fill_object(self, schema: dict[str, Any], path: str, depth: int) -> dict[str, Any]:
        properties = schema.get("properties") or {}
        return {name: self.fill(sub, f"{path}.{name}", depth + 1) for name, sub in properties.items()}

    def _fill_array(self, schema: dict[str, Any], path: str, depth: int) -> list[Any]:
        low = int(schema.get("minItems", 0))
        high = schema.get("maxItems")
        count = max(low, 1)
        if high is not None:
            count = min(count, int(high))
        items = schema.get("items", {})
        values: list[Any] = []
        for index in range(count):
            value = self.fill(items, f"{path}[{index}]", depth + 1)
            if schema.get("uniqueItems") and value in values:
                value = self._distinct_item(items, values, path, depth)
            values.append(value)
        return values

    def _distinct_item(self, items: Any, taken: list[Any], path: str, depth: int) -> Any:
        resolved = _resolve(items, self.root) if isinstance(items, dict) else {}
        for option in resolved.get("enum", []):
            if option not in taken:
                return option
        for attempt in range(1, 100):
            candidate = self.fill(items, f"{path}#{attempt}", depth + 1)
            if candidate not in taken:
                return candidate
            if isinstance(candidate, str):
                candidate = f"{candidate} {attempt}"
                if candidate not in taken:
                    return candidate
        raise ValueError(f"cannot build unique items at {path}")

    def _fill_string(self, schema: dict[str, Any], path: str, depth: int) -> str:
        value = _FORMATS.get(str(schema.get("format")), self.snippet)
        min_length = int(schema.get("minLength", 0))
        if len(value) < min_length:
            value = value + "x" * (min_length - len(value))
        if "maxLength" in schema:
            value = value[: int(schema["maxLength"])]
        return value

    @staticmethod
    def _bounds(schema: dict[str, Any]) -> tuple[float | None, bool, float | None, bool]:
        """(low, low is exclusive, high, high is exclusive), for draft-4 and later spellings."""

        def bound(plain: str, exclusive: str) -> tuple[float | None, bool]:
            marker = schema.get(exclusive)
            if isinstance(marker, (int, float)) and not isinstance(marker, bool):
                return marker, True
            return schema.get(plain), marker is True

        low, low_x = bound("minimum", "exclusiveMinimum")
        high, high_x = bound("maximum", "exclusiveMaximum")
        return low, low_x, high, high_x

    def _fill_integer(self, schema: dict[str, Any], path: str, depth: int) -> int:
        low, low_x, high, high_x = self._bounds(schema)
        lo = None if low is None else (math.floor(low) + 1 if low_x else math.ceil(low))
        hi = None if high is None else (math.ceil(high) - 1 if high_x else math.floor(high))
        if lo is None:
            lo = 0 if hi is None or hi >= 9 else hi - 9
        if hi is None:
            hi = lo + 9
        span = max(hi - lo, 0)
        return int(lo + int(stable_hex(self.text, path, length=8), 16) % (span + 1))

    def _fill_number(self, schema: dict[str, Any], path: str, depth: int) -> float:
        low, _, high, _ = self._bounds(schema)
        if low is not None and high is not None:
            return (float(low) + float(high)) / 2.0
        if low is not None:
            return float(low) + 0.5
        if high is not None:
            return float(high) - 0.5
        return 0.5

    def _fill_boolean(self, schema: dict[str, Any], path: str, depth: int) -> bool:
        return int(stable_hex(self.text, path, length=2), 16) % 2 == 0

    def _fill_null(self, schema: dict[str, Any], path: str, depth: int) -> None:
        return None


def fill_schema(schema: dict[str, Any], text: str, instructions: str = "") -> Any:
    """A deterministic instance of ``schema`` for the message ``text`` (label descriptions in ``instructions``
    steer enum choices)."""
    hints = label_hints(instructions)
    labels = _enum_properties(schema)
    if labels is not None:  # what ``SchemaFiller.fill`` gives such a schema, without its walk (~3 us a line)
        return {name: pick_label(enum, text, f"$.{name}", hints) for name, enum in labels}
    return SchemaFiller(schema, text, hints).fill()


# what ``SchemaFiller.fill`` reads of a node before its ``enum``
_PLAIN_KEYS = frozenset(("$ref", "allOf", "const", "anyOf", "oneOf"))


def _enum_properties(schema: Any) -> list[tuple[str, list[Any]]] | None:
    """(name, enum) of each property when ``schema`` is an object whose every property is a plain ``enum`` (a
    choice job's schema), as ``SchemaFiller.fill`` reads it; None for any other schema."""
    if not isinstance(schema, dict) or not schema or "enum" in schema or not _PLAIN_KEYS.isdisjoint(schema):
        return None
    if _schema_type(schema) != "object":
        return None
    properties = schema.get("properties") or {}
    if not isinstance(properties, dict):
        return None
    labels = []
    for name, sub in properties.items():
        if not isinstance(sub, dict) or not isinstance(sub.get("enum"), list) or not _PLAIN_KEYS.isdisjoint(sub):
            return None
        labels.append((name, sub["enum"]))
    return labels
