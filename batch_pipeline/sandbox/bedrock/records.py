"""One Bedrock batch record: its input line read from S3, and its output line (``modelOutput`` or ``error``).

Claude's ``modelInput`` is the Messages body without ``model`` (the job names the model) and with
``anthropic_version: bedrock-2023-05-31``; Bedrock validates only the line's frame when the job is created, so a
malformed ``modelInput`` becomes that record's ``error`` (HTTP-like ``errorCode``), as on the real service. The
answer itself comes from the Anthropic responder: ``modelOutput`` is the InvokeModel response body.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from batch_pipeline.sandbox.anthropic.responder import AnthropicRunner
from batch_pipeline.sandbox.ids import stable_hex
from batch_pipeline.sandbox.scenarios import Scenario
from batch_pipeline.sandbox.store import BilledTokens

ANTHROPIC_VERSION = "bedrock-2023-05-31"
ERROR_CODES = {
    "invalid_request_error": 400,
    "permission_error": 403,
    "not_found_error": 404,
    "rate_limit_error": 429,
    "api_error": 500,
    "overloaded_error": 503,
}


class InputError(ValueError):
    """A line of an input file that is not a record (the job fails validation)."""


@dataclass
class InputRecord:
    """A record as read from the input file: where it came from and what it asks."""

    file: str  # the input object's key
    line: int  # 1-based line number in that file
    record_id: str
    model_input: Any

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "record_id": self.record_id, "model_input": self.model_input}


@dataclass
class RecordResult(BilledTokens):
    """A processed record: its output line and the tokens it is billed for."""

    index: int
    output: dict[str, Any]

    @property
    def succeeded(self) -> bool:
        return "modelOutput" in self.output


def parse_input(file: str, data: bytes) -> list[InputRecord]:
    """The records of one JSONL input file; InputError for a line that is not ``{"recordId"?, "modelInput"}``.

    A record without ``recordId`` gets one (11 characters, as Bedrock generates them)."""
    records = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except ValueError as exc:
            raise InputError(f"{file} line {number}: not valid JSON ({exc})") from None
        if not isinstance(line, dict) or "modelInput" not in line:
            raise InputError(f"{file} line {number}: a record needs a modelInput object")
        record_id = line.get("recordId")
        if record_id is None:
            record_id = stable_hex(file, str(number), length=11).upper()
        if not isinstance(record_id, str) or not record_id:
            raise InputError(f"{file} line {number}: recordId must be a non-empty string")
        records.append(InputRecord(file, number, record_id, line["modelInput"]))
    return records


def _check_claude_input(model_input: Any) -> str | None:
    """Why a Claude ``modelInput`` is malformed (the message Bedrock's InvokeModel gives), or None."""
    if not isinstance(model_input, dict):
        return "Malformed input request: #: expected type: JSONObject"
    if model_input.get("anthropic_version") != ANTHROPIC_VERSION:
        return (
            f"Malformed input request: #: required key [anthropic_version] not found or not "
            f"{ANTHROPIC_VERSION!r}, please reformat your input and try again."
        )
    if "model" in model_input:
        return "Malformed input request: #: extraneous key [model] is not permitted, please reformat your input."
    tokens = model_input.get("max_tokens")
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
        return "Malformed input request: #: required key [max_tokens] not found, please reformat your input."
    if not isinstance(model_input.get("messages"), list) or not model_input["messages"]:
        return "Malformed input request: #: required key [messages] not found, please reformat your input."
    return None


def process(
    runner: AnthropicRunner, job_id: str, model_id: str, index: int, record: InputRecord, scenario: Scenario
) -> RecordResult:
    """The output line of one record under the job's scenario (markers, line errors, the output contract)."""
    head = {"recordId": record.record_id, "modelInput": record.model_input}
    problem = _check_claude_input(record.model_input)
    if problem is not None:
        return RecordResult(index, {**head, "error": {"errorCode": 400, "errorMessage": problem}})
    params = {k: v for k, v in record.model_input.items() if k != "anthropic_version"}
    result = runner.run(job_id, {"custom_id": record.record_id, "params": {**params, "model": model_id}}, scenario)
    if not result.succeeded:
        inner = (result.result.get("error") or {}).get("error") or {}
        code = ERROR_CODES.get(str(inner.get("type")), 500)
        return RecordResult(index, {**head, "error": {"errorCode": code, "errorMessage": inner.get("message", "")}})
    message = dict(result.result["message"])
    usage = message.get("usage") or {}
    message["usage"] = {
        k: usage.get(k, 0)
        for k in ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    }
    return RecordResult(index, {**head, "modelOutput": message}, **asdict(result.billed()))
