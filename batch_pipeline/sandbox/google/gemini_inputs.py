"""The requests of a Gemini batch: an uploaded JSONL file's lines, or inline requests (``inputConfig.requests``).

Shared by both kinds of batch: ``problem_of`` says why one request cannot be answered (a
``GenerateContentRequest`` without ``contents``, an ``EmbedContentRequest`` without text), which fails the
batch as the API fails it, naming the line. A file's lines are read one at a time (``scan_input``): parsed whole, a
50,000-line input was ~150 MB of dicts at create.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from batch_pipeline.sandbox.google.errors import GoogleError

Problem = Callable[[dict[str, Any]], str | None]


def contents_problem(request: dict[str, Any]) -> str | None:
    """Why a ``GenerateContentRequest`` cannot be answered (None when it can)."""
    contents = request.get("contents")
    return None if isinstance(contents, list) and contents else "`request.contents` must not be empty."


def request_key(request: dict[str, Any]) -> str:
    """The identity of an inline request without a ``metadata.key``: a digest of the request itself, so a
    request sent again in a later batch is the same request (``line_errors``, the ledger's ``custom_id``)."""
    canonical = json.dumps(request, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return "request-" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def parse_inline(config: Any, problem_of: Problem = contents_problem) -> tuple[list[dict[str, Any]], str | None]:
    """The requests of ``inputConfig.requests`` (``{"requests": [{"request", "metadata"?}]}``) and why the batch
    will fail (as a file's ``parse_input``); a body that is not that shape is a 400 at once, as the API's JSON
    parsing answers it. Each request's key (its identity for line errors and the ledger) is ``metadata.key``
    when that is a string, else ``request_key``."""
    where = "batch.input_config.requests"
    items = config.get("requests") if isinstance(config, dict) else None
    if not isinstance(config, dict) or not isinstance(items, list):
        raise GoogleError(400, f"Invalid JSON payload received. `{where}` must be an object with a `requests` list.")
    requests: list[dict[str, Any]] = []
    invalid: str | None = None
    for number, item in enumerate(items):
        at = f"{where}.requests[{number}]"
        if not isinstance(item, dict):
            raise GoogleError(400, f"Invalid JSON payload received. `{at}` must be an object.")
        unknown = sorted(set(item) - {"request", "metadata"})
        if unknown:
            raise GoogleError(
                400, f"Invalid JSON payload received. Unknown name \"{unknown[0]}\" at '{at}': Cannot find field."
            )
        request, metadata = item.get("request"), item.get("metadata")
        if not isinstance(request, dict):
            raise GoogleError(400, f"Invalid JSON payload received. `{at}.request` must be an object.")
        if metadata is not None and not isinstance(metadata, dict):
            raise GoogleError(400, f"Invalid JSON payload received. `{at}.metadata` must be an object.")
        problem = problem_of(request)
        if problem is not None and invalid is None:
            invalid = f"Inline request {number}: {problem}"
        key = metadata.get("key") if isinstance(metadata, dict) else None
        entry: dict[str, Any] = {
            "key": key if isinstance(key, str) and key else request_key(request),
            "request": request,
        }
        if metadata is not None:
            entry["metadata"] = metadata
        requests.append(entry)
    if not requests:
        raise GoogleError(400, f"`{where}.requests` must not be empty.")
    return requests, invalid


@dataclass
class InputScan:
    """What reading an input file found besides its requests: why it is invalid (None when every line is a
    request) and the SHA-256 of its bytes (what its processing order is shuffled by)."""

    invalid: str | None = None
    digest: Any = field(default_factory=hashlib.sha256)


def scan_input(source: BinaryIO, scan: InputScan, problem_of: Problem = contents_problem) -> Iterator[dict[str, Any]]:
    """The requests of an input file, read a line at a time, up to the first line that is not one (``scan`` says
    why); the rest is read for the digest only. Lines are numbered as ``bytes.splitlines`` numbers them."""
    seen: set[str] = set()
    number = 0
    for raw in source:
        scan.digest.update(raw)
        for line in raw.splitlines():
            number += 1
            if scan.invalid is not None or not line.strip():
                continue
            request, scan.invalid = _request_of(number, line, seen, problem_of)
            if request is not None:
                seen.add(request["key"])
                yield request
    if not seen and scan.invalid is None:
        scan.invalid = "The input file holds no requests."


def _request_of(
    number: int, line: bytes, seen: set[str], problem_of: Problem
) -> tuple[dict[str, Any] | None, str | None]:
    """Line ``number`` as a request (``{"key", "request"}``), or why it is not one."""
    try:
        obj = json.loads(line)
    except ValueError as exc:
        return None, f"Invalid JSON in the input file at line {number}: {exc}"
    if not isinstance(obj, dict) or not isinstance(obj.get("request"), dict):
        return None, f"Line {number} of the input file has no `request` object."
    key = obj.get("key")
    if not isinstance(key, str) or not key:
        return None, f"Line {number} of the input file has no `key`."
    if key in seen:
        return None, f"Line {number}: duplicate key {key!r}."
    problem = problem_of(obj["request"])
    if problem is not None:
        return None, f"Line {number}: {problem}"
    return {"key": key, "request": obj["request"]}, None
