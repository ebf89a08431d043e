"""The contract floor: the shortest answer an output contract allows, and a token count it cannot go under.

A job whose ``sampling.max_tokens`` cannot hold even that answer truncates every request (``finish_reason:
length``) and pays for all of them, so ``JobSpec`` refuses it at load (``core/spec/job.py``).

``shortest_answer`` builds the answer: for ``choice`` the shortest label, in the form the backend returns it
(``CHOICE_FORMS``); for ``json_schema`` the minimal instance, compact (``{"label":"","score":0}``): only the
``required`` properties, ``""`` (or ``minLength`` ``a``s) for a string, the number nearest 0 inside
``minimum``/``exclusiveMinimum``/``maximum``/``exclusiveMaximum`` (and ``multipleOf``), ``false``, ``null``,
``minItems`` copies of the minimal item, the shortest ``enum`` value or ``const``, the shortest ``anyOf`` /
``oneOf`` branch, ``allOf`` merged, ``$ref`` to ``#/$defs/...`` or ``#/definitions/...`` of the same schema;
for ``text`` the empty string (any real answer is at least one token).

Other keywords (``pattern``, ``format``, ``uniqueItems``, ``minProperties``, ...) are ignored: they can only
make a real answer longer, so the floor stays a floor even where the built instance would not validate.
Pure Python: no dagster, no SDK, no tokenizer download.
"""

import json
import math
import unicodedata
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from batch_pipeline.core.spec.job import OutputSpec

CHOICE_KEY = "label"  # the key of a wrapped choice answer
WRAPPED = "wrapped"  # {"label": "<label>"}: the choice enforced as a JSON schema (choice_schema below)
BARE = "bare"  # the label itself, decoded natively from the label set
# How each backend returns a choice answer (see batch_pipeline/executors/*). openai_batch and online send
# ``response_format: json_schema`` with ``choice_schema`` (openai_format.response_format); anthropic_batch forces
# a tool whose ``input_schema`` is ``choice_schema`` (anthropic_format.output_schema); vllm decodes
# ``structured_outputs.choice`` to the bare label (vllm_prompts.sampling_params). A backend not listed here
# counts as BARE, the lower of the two, so an unknown backend is never refused for the wrapper.
CHOICE_FORMS: dict[str, str] = {
    "openai_batch": WRAPPED,
    "online": WRAPPED,
    "anthropic_batch": WRAPPED,
    "bedrock_batch": WRAPPED,
    "vllm": BARE,
}
TEXT_FLOOR_TOKENS = 1  # a text answer must not be empty (core/validate)


def token_floor(text: str) -> int:
    """A lower bound of the tokens ``text`` takes under the usual BPE tokenizers: its pre-tokenizer pieces.

    cl100k and o200k (OpenAI's), and the tokenizers built the same way (GPT-2/r50k, Llama 3, the byte-level
    BPE of ``tokenizers``), first split text with a regex into pieces (a run of letters, possibly with one
    leading punctuation mark or space; a run of digits; a run of punctuation; whitespace), then run BPE inside
    each piece. A merge never crosses a piece, so a text takes at least as many tokens as it has pieces. The
    pieces counted here are coarser than those regexes' (letters, digits and combining marks together, an
    apostrophe between letters kept in the word, whitespace not counted, a single punctuation mark in front of
    a word counted with it, newlines and slashes after punctuation counted with it), so the count is at most
    the tokenizer's: ``{"label":"bug"}`` is 5 (``{"`` ``label`` ``":"`` ``bug`` ``"}``, 5 tokens in cl100k and
    o200k), ``{"label":"","score":0}`` is 7 (7 in both). Checked against cl100k and o200k on random strings of
    letters, digits, punctuation, whitespace and non-ASCII characters: never above either.

    Not bytes / 4 (``core/cost.estimate_tokens``): that is the *mean* for prose, not a bound. A long word is
    one or two tokens (``feature_request`` is 2 in cl100k, 15 bytes), and JSON punctuation, though it
    tokenises at about one token per 2-3 characters, merges into runs (``":"``, ``","`` and ``"}`` are single
    tokens), so neither bytes / 4 nor a per-character rule for punctuation is a lower bound. Claude's
    tokenizer is not public; it is assumed to split at least as finely (no token joins letters to the
    punctuation after them, nor crosses whitespace). Tool-use framing and whitespace a model adds only
    add tokens.
    """
    pieces = 0
    kinds = [_kind(c) for c in text]
    n = len(text)
    i = 0
    while i < n:
        kind = kinds[i]
        if kind == _SPACE:
            i += 1
            continue
        j = i + 1
        if kind == _WORD:
            while j < n and (kinds[j] == _WORD or (text[j] == "'" and j + 1 < n and kinds[j + 1] == _WORD)):
                j += 1
            pieces += 1
        else:
            while j < n and kinds[j] == _PUNCT:
                j += 1
            while j < n and text[j] in "\r\n/":  # o200k ends a punctuation piece with ``[\r\n/]*``
                j += 1
            # one mark straight before a word can share its piece (cl100k/o200k: ``[^\r\n\p{L}\p{N}]?\p{L}+``)
            if not (j - i == 1 and j < n and kinds[j] == _WORD and unicodedata.category(text[j])[0] != "N"):
                pieces += 1
        i = j
    return pieces


_WORD, _PUNCT, _SPACE = 0, 1, 2


def _kind(char: str) -> int:
    if char.isspace() and char not in "\x1c\x1d\x1e\x1f":  # \s of the tokenizers' regexes (Unicode White_Space)
        return _SPACE
    return _WORD if unicodedata.category(char)[0] in "LNM" else _PUNCT


def dump(value: Any) -> str:
    """Compact JSON, characters unescaped: the shortest way a model can write ``value``."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


Key = Callable[[str], tuple[int, int]]  # orders candidate texts: the first is the one kept


def _by_length(text: str) -> tuple[int, int]:
    return len(text), token_floor(text)


def _by_tokens(text: str) -> tuple[int, int]:
    """Fewest pieces *in place*: a JSON value always sits between punctuation (``":`` or ``[`` or ``,`` before
    it, ``,`` ``}`` or ``]`` after), which merges with a value's own leading and trailing punctuation, so
    ``""`` (in ``":""}``, one piece) beats ``0`` (``":`` ``0`` ``}``, three)."""
    return token_floor(f'":{text}}}'), len(text)


def _fewest_pieces(text: str) -> tuple[int, int]:
    return token_floor(text), len(text)


def _wrapper_schema(output: "OutputSpec", backend: str | None) -> dict[str, Any] | None:
    """The JSON schema a backend enforces the contract with; None for a bare choice label or free text."""
    if output.json_schema is not None:
        return output.json_schema
    if output.choice is not None and CHOICE_FORMS.get(backend or "", BARE) == WRAPPED:
        return choice_schema(list(output.choice))
    return None


def _answer(output: "OutputSpec", backend: str | None, by_tokens: bool) -> str:
    schema = _wrapper_schema(output, backend)
    if schema is not None:
        try:
            return dump(_Minimal(schema, _by_tokens if by_tokens else _by_length).instance(schema))
        except _NoInstance:
            return "{}"  # no instance could be built (a required recursion): the smallest object
    if output.choice is not None:  # a bare label, as written
        return min(output.choice, key=_fewest_pieces if by_tokens else _by_length)
    return ""


def shortest_answer(output: "OutputSpec", backend: str | None = None) -> str:
    """The shortest text that satisfies the output contract, as ``backend`` returns it (default: the bare form).

    ``choice``: the shortest label (``{"label":"bug"}`` on a backend that wraps it, ``CHOICE_FORMS``);
    ``json_schema``: the minimal instance, compact; ``text``: ``""``.
    """
    return _answer(output, backend, by_tokens=False)


def answer_floor(output: "OutputSpec", backend: str | None = None) -> tuple[str, int]:
    """(the valid answer with the fewest tokens, its ``token_floor``); at least ``TEXT_FLOOR_TOKENS``."""
    if output.kind == "text":
        return "", TEXT_FLOOR_TOKENS
    # alternatives picked by pieces in place, and the shortest text: whichever counts fewer (both are valid)
    text = min(_answer(output, backend, by_tokens=True), _answer(output, backend, by_tokens=False), key=_fewest_pieces)
    return text, max(TEXT_FLOOR_TOKENS, token_floor(text))


def min_answer_tokens(output: "OutputSpec", backend: str | None = None) -> int:
    """A conservative (low) count of the tokens the shortest valid answer takes on ``backend``: with
    ``max_tokens`` below it no valid answer fits. ``token_floor`` is a lower bound of a text's tokens (see
    there); the answer it is taken of is the fewest-piece one built (alternatives such as enum values, types
    and branches picked one position at a time, in place), and real answers carry every required property,
    so they only add to it."""
    return answer_floor(output, backend)[1]


class _NoInstance(Exception):
    """The (sub)schema admits no value we can build."""


class _Minimal:
    """The minimal instance of a JSON schema; ``key`` orders the alternatives (enum values, branches, types)."""

    def __init__(self, root: dict[str, Any], key: Key) -> None:
        self.root = root
        self.key = key

    def instance(self, schema: Any, refs: tuple[str, ...] = ()) -> Any:
        if schema is False:
            raise _NoInstance("false schema")
        if not isinstance(schema, dict):
            return 0  # true (or not a schema): anything goes, and 0 is the shortest JSON value
        if "$ref" in schema:
            target, refs = self.follow(schema["$ref"], refs)
            return self.instance(_merge(target, {k: v for k, v in schema.items() if k != "$ref"}), refs)
        if "allOf" in schema:
            merged: Any = {k: v for k, v in schema.items() if k != "allOf"}
            for sub in schema["allOf"]:
                while isinstance(sub, dict) and "$ref" in sub:
                    target, refs = self.follow(sub["$ref"], refs)
                    sub = _merge(target, {k: v for k, v in sub.items() if k != "$ref"})
                merged = _merge(merged, sub)
            return self.instance(merged, refs)
        if "const" in schema:
            return schema["const"]
        if "enum" in schema:
            if not schema["enum"]:
                raise _NoInstance("empty enum")
            return min(schema["enum"], key=lambda value: self.key(dump(value)))
        for word in ("anyOf", "oneOf"):
            if word in schema:
                rest = {k: v for k, v in schema.items() if k != word}
                branches = [lambda b=b, rest=rest: self.instance(_merge(rest, b), refs) for b in schema[word]]
                return self.shortest(branches)
        types = schema.get("type", _implied_type(schema))
        types = [types] if isinstance(types, str) else list(types) if types is not None else []
        if not types:
            return 0
        return self.shortest([lambda t=t: self.typed(t, schema, refs) for t in types])

    def shortest(self, builders: list[Callable[[], Any]]) -> Any:
        found = []
        for build in builders:
            try:
                found.append(build())
            except _NoInstance:
                continue
        if not found:
            raise _NoInstance("no alternative can be built")
        return min(found, key=lambda value: self.key(dump(value)))

    def typed(self, kind: str, schema: dict[str, Any], refs: tuple[str, ...]) -> Any:
        if kind == "string":
            return "a" * int(schema.get("minLength", 0))
        if kind in ("integer", "number"):
            return _number(schema, integer=kind == "integer")
        if kind == "boolean":
            return False
        if kind == "null":
            return None
        if kind == "array":
            count = int(schema.get("minItems", 0))
            prefix = schema.get("prefixItems") or []
            head = [self.instance(s, refs) for s in prefix[:count]]
            if count <= len(head):
                return head
            if schema.get("items") is False:
                raise _NoInstance("more items required than prefixItems allow")
            return head + [self.instance(schema.get("items", {}), refs)] * (count - len(head))
        if kind == "object":
            props = schema.get("properties") or {}
            extra = schema.get("additionalProperties", {})
            obj = {}
            for name in schema.get("required") or []:
                if name not in obj:
                    obj[name] = self.instance(props.get(name, extra if isinstance(extra, dict) else {}), refs)
            return obj
        raise _NoInstance(f"unknown type {kind!r}")

    def follow(self, ref: str, refs: tuple[str, ...]) -> tuple[Any, tuple[str, ...]]:
        """The schema a ``$ref`` points to, and the refs followed so far (a ref met again is a recursion that
        every instance would have to repeat forever: no instance on that path)."""
        if ref in refs:
            raise _NoInstance(f"{ref} needs itself")
        return self.resolve(ref), (*refs, ref)

    def resolve(self, ref: str) -> Any:
        """A ``#/...`` JSON pointer into the root schema (``#/$defs/x``, ``#/definitions/x``, ``#``); anything
        else (a remote ref, a dangling pointer) counts as the any-schema."""
        if not ref.startswith("#"):
            return {}
        node: Any = self.root
        for part in [p for p in ref[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return {}
        return node


def _implied_type(schema: dict[str, Any]) -> str | None:
    if "properties" in schema or "required" in schema:
        return "object"
    if "items" in schema or "prefixItems" in schema or "minItems" in schema:
        return "array"
    if "minLength" in schema:
        return "string"
    if any(k in schema for k in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum", "multipleOf")):
        return "number"
    return None


def _merge(a: Any, b: Any) -> Any:
    """Two schemas that both apply, merged shallowly (``required`` joined, ``properties`` united)."""
    if a is False or b is False:
        return False
    if not isinstance(a, dict):
        return b
    if not isinstance(b, dict):
        return a
    out = {**a, **b}
    if "required" in a and "required" in b:
        out["required"] = list(dict.fromkeys([*a["required"], *b["required"]]))
    if "properties" in a and "properties" in b:
        out["properties"] = {**a["properties"], **b["properties"]}
    return out


def _bounds(schema: dict[str, Any]) -> tuple[float | None, bool, float | None, bool]:
    """(low, low exclusive, high, high exclusive), draft 2020-12 numbers or draft-4 booleans."""
    low, high = schema.get("minimum"), schema.get("maximum")
    low_x = high_x = False
    ex_low, ex_high = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if isinstance(ex_low, bool):
        low_x = ex_low
    elif isinstance(ex_low, int | float) and (low is None or ex_low >= low):
        low, low_x = ex_low, True
    if isinstance(ex_high, bool):
        high_x = ex_high
    elif isinstance(ex_high, int | float) and (high is None or ex_high <= high):
        high, high_x = ex_high, True
    return low, low_x, high, high_x


def _number(schema: dict[str, Any], integer: bool) -> int | float:
    """The number nearest 0 that the bounds (and an integer ``multipleOf``) allow; an integer if one fits."""
    low, low_x, high, high_x = _bounds(schema)
    step = schema.get("multipleOf")
    step = step if isinstance(step, int) and not isinstance(step, bool) and step > 0 else 1
    lo = None if low is None else (math.floor(low) + 1 if low_x else math.ceil(low))
    hi = None if high is None else (math.ceil(high) - 1 if high_x else math.floor(high))
    if lo is not None:
        lo = -((-lo) // step) * step
    if hi is not None:
        hi = (hi // step) * step
    if lo is None or hi is None or lo <= hi:
        value = lo if lo is not None and lo > 0 else hi if hi is not None and hi < 0 else 0
        if (lo is None or value >= lo) and (hi is None or value <= hi):
            return value
    if integer:
        raise _NoInstance("no integer in range")
    # no integer between the bounds (so both are set): an inclusive bound, else the midpoint
    if not low_x:
        return low
    if not high_x:
        return high
    return (low + high) / 2


def choice_schema(labels: list[str]) -> dict:
    """The JSON schema a backend without native choice decoding uses to enforce a label set."""
    return {
        "type": "object",
        "properties": {CHOICE_KEY: {"type": "string", "enum": labels}},
        "required": [CHOICE_KEY],
        "additionalProperties": False,
    }
