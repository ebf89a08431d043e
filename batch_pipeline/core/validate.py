"""Structural validation of outputs against the job's output contract.

A result is ``succeeded`` only when the provider answered 200, the output was not truncated
(``finish_reason == "length"`` is a failure), and it honours the contract: a label from the allowed
set (bare, or as ``{"label": ...}`` when the backend enforced the choice with a JSON schema), an object
that validates against the JSON schema, or non-empty text.
"""

import json
from dataclasses import dataclass

import jsonschema
import pyarrow as pa
import pyarrow.compute as pc

from batch_pipeline.core.errors import ErrorClass, classify_line_error
from batch_pipeline.core.spec import OutputSpec

SUCCEEDED = "succeeded"
INVALID = "invalid"
ERRORED = "errored"
CHOICE_KEY = "label"


@dataclass
class Verdicts:
    status: pa.Array
    parsed_output: pa.Array
    error_class: pa.Array
    error_code: pa.Array
    error_message: pa.Array


def choice_schema(labels: list[str]) -> dict:
    """The JSON schema a backend without native choice decoding uses to enforce a label set."""
    return {"type": "object", "properties": {CHOICE_KEY: {"type": "string", "enum": labels}},
            "required": [CHOICE_KEY], "additionalProperties": False}


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


def _fast_choice(texts: pa.Array, labels: list[str]) -> pa.Array | None:
    """Column-wise check of bare labels; None when some rows need the JSON path."""
    stripped = pc.utf8_trim_whitespace(texts)
    ok = pc.is_in(stripped, value_set=pa.array(labels))
    return stripped if pc.all(ok).as_py() else None


def validate(raw: pa.Table, output: OutputSpec) -> Verdicts:
    """Classify every raw result row: succeeded, invalid (answered but unusable) or errored."""
    n = raw.num_rows
    http = raw.column("http_status").to_pylist()
    finish = raw.column("finish_reason").to_pylist()
    codes = raw.column("error_code").to_pylist()
    messages = raw.column("error_message").to_pylist()
    texts_col = raw.column("output_text").combine_chunks() if n else pa.array([], pa.string())
    answered = [h == 200 for h in http]
    parsed: list[tuple[str | None, str | None]]
    if output.kind == "choice":
        fast = _fast_choice(texts_col, output.choice or []) if all(answered) and n else None
        if fast is not None:
            parsed = [(t, None) for t in fast.to_pylist()]
        else:
            parsed = _parse_choice(texts_col.to_pylist(), set(output.choice or []))
    elif output.kind == "json_schema":
        parsed = _parse_json(texts_col.to_pylist(), output.json_schema or {})
    else:
        parsed = _parse_text(texts_col.to_pylist())
    status, value, eclass, ecode, emsg = [], [], [], [], []
    for i in range(n):
        if not answered[i]:
            status.append(ERRORED)
            value.append(None)
            eclass.append(classify_line_error(codes[i], http[i]).value)
            ecode.append(codes[i] or (f"http_{http[i]}" if http[i] else "no_response"))
            emsg.append(messages[i] or "no response for this request")
        elif finish[i] == "length":
            status.append(INVALID)
            value.append(None)
            eclass.append(ErrorClass.INVALID_OUTPUT.value)
            ecode.append("truncated")
            emsg.append("output hit max_tokens (finish_reason=length)")
        elif parsed[i][1] is not None:
            status.append(INVALID)
            value.append(None)
            eclass.append(ErrorClass.INVALID_OUTPUT.value)
            ecode.append("contract_violation")
            emsg.append(parsed[i][1])
        else:
            status.append(SUCCEEDED)
            value.append(parsed[i][0])
            eclass.append(None)
            ecode.append(None)
            emsg.append(None)
    s = pa.string()
    return Verdicts(pa.array(status, s), pa.array(value, s), pa.array(eclass, s), pa.array(ecode, s), pa.array(emsg, s))
