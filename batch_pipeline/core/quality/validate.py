"""Structural validation of outputs against the job's output contract.

A result is ``succeeded`` only when the provider answered 200, the output was not truncated
(``finish_reason == "length"`` is a failure), and it honours the contract: a label from the allowed
set (bare, or as ``{"label": ...}`` when the backend enforced the choice with a JSON schema), an object
that validates against the JSON schema, non-empty text, or (an embeddings job) a vector of exactly the asked
dimension, every value finite and the norm above zero.
"""

import json
from dataclasses import dataclass
from enum import StrEnum

import jsonschema
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batch_pipeline.core.errors import ErrorClass, classify_line_error
from batch_pipeline.core.spec.contract_floor import CHOICE_KEY
from batch_pipeline.core.spec.job import OutputSpec


class ResultStatus(StrEnum):
    """The outcome of one request in one attempt (the ``status`` column of every result row)."""

    SUCCEEDED = "succeeded"
    INVALID = "invalid"  # answered, but outside the output contract (or truncated)
    ERRORED = "errored"  # no answer: the provider or the transport failed (its error class says why)


SUCCEEDED, INVALID, ERRORED = (s.value for s in ResultStatus)  # plain strings for Arrow and Polars expressions


@dataclass
class Verdicts:
    status: pa.Array
    parsed_output: pa.Array
    error_class: pa.Array
    error_code: pa.Array
    error_message: pa.Array


def _parse_choice(texts: list[str | None], labels: set[str]) -> list[tuple[str | None, str | None]]:
    out: list[tuple[str | None, str | None]] = []
    for text in texts:
        if text is None:
            out.append((None, "empty output"))
            continue
        s = text.strip()
        if s in labels:
            out.append((s, None))
            continue
        try:
            obj = json.loads(s)
        except ValueError:
            out.append((None, f"output {s[:60]!r} is not one of the allowed labels"))
            continue
        value = obj.get(CHOICE_KEY) if isinstance(obj, dict) else obj if isinstance(obj, str) else None
        if isinstance(value, str) and value in labels:
            out.append((value, None))
        else:
            out.append((None, f"output {s[:60]!r} is not one of the allowed labels"))
    return out


def _parse_json(texts: list[str | None], schema: dict) -> list[tuple[str | None, str | None]]:
    validator = jsonschema.Draft202012Validator(schema)
    out: list[tuple[str | None, str | None]] = []
    for text in texts:
        try:
            obj = json.loads(text or "")
        except ValueError as exc:
            out.append((None, f"output is not JSON: {exc}"))
            continue
        error = jsonschema.exceptions.best_match(validator.iter_errors(obj))
        if error is not None:
            path = "/".join(str(p) for p in error.absolute_path) or "<root>"
            out.append((None, f"output fails the schema at {path}: {error.message[:200]}"))
        else:
            out.append((json.dumps(obj, sort_keys=True, ensure_ascii=False), None))
    return out


def _parse_text(texts: list[str | None]) -> list[tuple[str | None, str | None]]:
    return [(t, None) if t and t.strip() else (None, "empty output") for t in texts]


# The forms a choice output takes when it is settled column-wise: a bare label, or the object a backend with a
# JSON schema returns, compact or with one space after the colon. Anything else goes through the per-row parser.
_CHOICE_FORMS = ('{{"' + CHOICE_KEY + '":"{}"}}', '{{"' + CHOICE_KEY + '": "{}"}}')
TRUNCATED_MESSAGE = "output hit max_tokens (finish_reason=length)"


def _plain_labels(labels: list[str]) -> bool:
    """Labels that read the same as text, stripped, and inside a JSON string (so the column checks agree
    with ``_parse_choice``)."""
    return all(
        label and label == label.strip() and label.isprintable() and '"' not in label and "\\" not in label
        for label in labels
    )


def _choice_columns(texts: pa.Array, labels: list[str]) -> tuple[pa.Array, pa.Array]:
    """(settled, value): rows whose output is a bare allowed label or ``{"label": "<allowed>"}``. Plain labels
    need no escaping in JSON, so each settled form is one exact string: one hash lookup per row against every
    form (a regex over each output, then a lookup of its capture, cost 10x as much)."""
    allowed = list(dict.fromkeys(labels))
    forms = [*allowed, *(form.format(label) for form in _CHOICE_FORMS for label in allowed)]
    index = pc.index_in(texts, value_set=pa.array(forms, pa.string()))
    return pc.is_valid(index), pc.take(pa.array(allowed * (1 + len(_CHOICE_FORMS)), pa.string()), index)


def _scatter(base: pa.Array, mask: pa.Array, values: list) -> pa.Array:
    return pc.replace_with_mask(base, mask, pa.array(values, pa.string()))


EMBEDDING_TYPE = pa.list_(pa.float32())


def _embedding_checks(vectors: pa.Array | None, n: int, dimensions: int) -> tuple[pa.Array, pa.Array, pa.Array]:
    """(ok, parsed value, message) per row of an embeddings job, column-wise: the vector has ``dimensions``
    values, all finite, and a norm above zero (a zero vector has no direction: cosine similarity is undefined).
    The parsed value is ``{"dimensions": N, "norm": x}`` (the vector itself is the ``embedding`` column)."""
    if vectors is None:
        vectors = pa.nulls(n, EMBEDDING_TYPE)
    if isinstance(vectors, pa.ChunkedArray):
        vectors = vectors.combine_chunks()
    vectors = vectors.cast(EMBEDDING_TYPE)
    lengths = pc.fill_null(pc.list_value_length(vectors), -1).to_numpy(zero_copy_only=False)
    right = lengths == dimensions
    finite = np.zeros(n, dtype=bool)
    norms = np.zeros(n, dtype=np.float64)
    if right.any():
        flat = pc.list_flatten(vectors.filter(pa.array(right))).to_numpy(zero_copy_only=False)
        values = flat.astype(np.float64).reshape(-1, dimensions)  # a null value reads as NaN: not finite
        with np.errstate(over="ignore", invalid="ignore"):
            finite[right] = np.isfinite(values).all(axis=1)
            norms[right] = np.sqrt(np.square(values).sum(axis=1))
    ok = right & finite & (norms > 0)
    values_out: list[str | None] = []
    messages: list[str | None] = []
    for i in range(n):
        if ok[i]:
            values_out.append(f'{{"dimensions":{dimensions},"norm":{norms[i]:.6g}}}')
            messages.append(None)
            continue
        values_out.append(None)
        if lengths[i] < 0:
            messages.append("no embedding in the answer")
        elif not right[i]:
            messages.append(f"embedding has {lengths[i]} dimensions; output.embedding.dimensions is {dimensions}")
        elif not finite[i]:
            messages.append("embedding has non-finite values (NaN or infinity)")
        else:
            messages.append("embedding is the zero vector (norm 0)")
    return pa.array(ok), pa.array(values_out, pa.string()), pa.array(messages, pa.string())


def validate(raw: pa.Table, output: OutputSpec, vectors: pa.Array | pa.ChunkedArray | None = None) -> Verdicts:
    """Classify every raw result row: succeeded, invalid (answered but unusable) or errored.

    Column-wise for the common rows (answered choice outputs in the usual forms, truncations); the per-row
    parsers run only on the rows the columns cannot settle, and the error rows are classified one by one.
    ``vectors``: an embeddings job's ``embedding`` column (list of float32), row for row with ``raw``.
    """
    s = pa.string()
    n = raw.num_rows
    if n == 0:
        return Verdicts(*(pa.array([], s) for _ in range(5)))
    if output.embedding is not None:
        return _validate_embeddings(raw, vectors, output.embedding.dimensions)
    http = raw.column("http_status").combine_chunks()
    texts = raw.column("output_text").combine_chunks()
    answered = pc.fill_null(pc.equal(http, 200), False)
    truncated = pc.and_(answered, pc.fill_null(pc.equal(raw.column("finish_reason").combine_chunks(), "length"), False))
    live = pc.and_not(answered, truncated)
    nulls = pa.nulls(n, s)
    if output.kind == "choice" and _plain_labels(output.choice or []):
        settled, settled_value = _choice_columns(texts, output.choice or [])
        ok = pc.and_(live, settled)
    else:
        ok, settled_value = pa.array([False] * n), nulls
    status = pc.if_else(ok, SUCCEEDED, pc.if_else(answered, INVALID, ERRORED)).cast(s)
    value = pc.if_else(ok, settled_value, nulls).cast(s)
    eclass = pc.if_else(pc.and_not(answered, ok), ErrorClass.INVALID_OUTPUT.value, nulls).cast(s)
    unsettled = pc.and_not(live, ok)
    ecode = pc.if_else(truncated, "truncated", pc.if_else(unsettled, "contract_violation", nulls)).cast(s)
    emsg = pc.if_else(truncated, TRUNCATED_MESSAGE, nulls).cast(s)

    if pc.any(unsettled).as_py():
        rows = texts.filter(unsettled).to_pylist()
        if output.kind == "choice":
            parsed = _parse_choice(rows, set(output.choice or []))
        elif output.kind == "json_schema":
            parsed = _parse_json(rows, output.json_schema or {})
        else:
            parsed = _parse_text(rows)
        good = [err is None for _, err in parsed]
        status = _scatter(status, unsettled, [SUCCEEDED if g else INVALID for g in good])
        value = _scatter(value, unsettled, [v for v, _ in parsed])
        eclass = _scatter(eclass, unsettled, [None if g else ErrorClass.INVALID_OUTPUT.value for g in good])
        ecode = _scatter(ecode, unsettled, [None if g else "contract_violation" for g in good])
        emsg = _scatter(emsg, unsettled, [err for _, err in parsed])

    return _with_errors(raw, answered, Verdicts(status, value, eclass, ecode, emsg))


def _validate_embeddings(raw: pa.Table, vectors: pa.Array | pa.ChunkedArray | None, dimensions: int) -> Verdicts:
    """An answered row succeeds when its vector passes ``_embedding_checks``; the others are invalid (retried
    within ``retries.invalid_output``); unanswered rows are classified as in ``validate``."""
    s = pa.string()
    n = raw.num_rows
    http = raw.column("http_status").combine_chunks()
    answered = pc.fill_null(pc.equal(http, 200), False)
    ok, value, message = _embedding_checks(vectors, n, dimensions)
    ok = pc.and_(answered, ok)
    nulls = pa.nulls(n, s)
    bad = pc.and_not(answered, ok)
    status = pc.if_else(ok, SUCCEEDED, pc.if_else(answered, INVALID, ERRORED)).cast(s)
    value = pc.if_else(ok, value, nulls).cast(s)
    eclass = pc.if_else(bad, ErrorClass.INVALID_OUTPUT.value, nulls).cast(s)
    ecode = pc.if_else(bad, "contract_violation", nulls).cast(s)
    emsg = pc.if_else(bad, message, nulls).cast(s)
    return _with_errors(raw, answered, Verdicts(status, value, eclass, ecode, emsg))


def _with_errors(raw: pa.Table, answered: pa.Array, v: Verdicts) -> Verdicts:
    """The unanswered rows classified one by one (error class from the code and HTTP status), each distinct
    (code, status, message) once: an error file repeats a few of them (2.5 ms per 1,000 rows classified per row)."""
    errored = pc.invert(answered)
    if not pc.any(errored).as_py():
        return v
    http = raw.column("http_status").combine_chunks()
    hs = http.filter(errored).to_pylist()
    cs = raw.column("error_code").combine_chunks().filter(errored).to_pylist()
    ms = raw.column("error_message").combine_chunks().filter(errored).to_pylist()
    classes: dict[tuple[str | None, int | None, str | None], str] = {}
    for key in zip(cs, hs, ms):
        if key not in classes:
            classes[key] = classify_line_error(*key).value
    return Verdicts(
        v.status,
        v.parsed_output,
        _scatter(v.error_class, errored, [classes[key] for key in zip(cs, hs, ms)]),
        _scatter(v.error_code, errored, [c or (f"http_{h}" if h else "no_response") for c, h in zip(cs, hs)]),
        _scatter(v.error_message, errored, [m or "no response for this request" for m in ms]),
    )
