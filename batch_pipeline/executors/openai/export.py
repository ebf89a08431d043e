"""Export published results in the OpenAI batch *output* file format (what OpenAI and vLLM's ``run_batch`` write).

One line per row of the validated table (every source row, duplicates included)::

    {"id": "batch_req_...", "custom_id": "<source key>",
     "response": {"status_code": 200, "request_id": "req_...", "body": <chat.completion>}, "error": null}

``custom_id`` is the row's source key (with an OpenAI/vLLM batch file as the job's input, its own
``custom_id``), else ``<source>:<line>``. The message content is the model's text as received
(``output_text``); usage carries the prompt, cached and completion tokens. Dead letters can be written as
the matching error file (``response: null``, ``error: {code, message}``), as the Batch API does.
Files are written to a temporary name and renamed, so a reader never sees half a file.
"""

import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

REQUIRED = (
    "request_id",
    "output_text",
    "output",
    "finish_reason",
    "model",
    "input_tokens",
    "cached_tokens",
    "output_tokens",
)


def _frame(table: pa.Table | pl.DataFrame) -> pl.DataFrame:
    frame = table if isinstance(table, pl.DataFrame) else pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    return frame


def _write_lines(path: str | Path, lines: Iterable[str]) -> int:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    n = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(line)
            f.write("\n")
            n += 1
    os.replace(tmp, path)
    return n


def _custom_id(row: dict[str, Any]) -> str:
    if row.get("source_key") is not None:
        return str(row["source_key"])
    if row.get("source") is not None and row.get("line") is not None:
        return f"{row['source']}:{row['line']}"
    return str(row["request_id"])


def output_line(row: dict[str, Any], created: int) -> dict[str, Any]:
    """The batch output line of one validated row."""
    rid = row["request_id"]
    prompt, cached, completion = (int(row.get(k) or 0) for k in ("input_tokens", "cached_tokens", "output_tokens"))
    content = row["output_text"] if row.get("output_text") is not None else row.get("output")
    body = {
        "id": f"chatcmpl-{rid[:24]}",
        "object": "chat.completion",
        "created": created,
        "model": row["model"],
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, "refusal": None},
                "logprobs": None,
                "finish_reason": row.get("finish_reason") or "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        },
    }
    return {
        "id": f"batch_req_{rid[:24]}",
        "custom_id": _custom_id(row),
        "response": {"status_code": 200, "request_id": f"req_{rid[:24]}", "body": body},
        "error": None,
    }


def export_openai_batch_output(
    validated: pa.Table | pl.DataFrame, path: str | Path, *, created: int | None = None
) -> int:
    """Write the validated table as an OpenAI batch output JSONL at ``path``; returns the number of lines."""
    frame = _frame(validated)
    missing = [c for c in REQUIRED if c not in frame.columns]
    if missing:
        raise ValueError(f"not a validated table: missing columns {missing}")
    stamp = int(time.time()) if created is None else created
    dumps = json.dumps
    return _write_lines(
        path,
        (
            dumps(output_line(row, stamp), ensure_ascii=False, separators=(",", ":"))
            for row in frame.iter_rows(named=True)
        ),
    )


def export_openai_batch_errors(dead_letters: pa.Table | pl.DataFrame, path: str | Path) -> int:
    """Write dead letters as an OpenAI batch error JSONL (``custom_id`` = request ID); returns the line count."""
    frame = _frame(dead_letters)
    return _write_lines(
        path,
        (
            json.dumps(
                {
                    "id": f"batch_req_{row['request_id'][:24]}",
                    "custom_id": row["request_id"],
                    "response": None,
                    "error": {
                        "code": row.get("last_error_code") or "dead_lettered",
                        "message": row.get("last_error")
                        or f"dead-lettered after {row.get('failures')} failed attempts",
                    },
                },
                ensure_ascii=False,
                separators=(",", ":"),
            )
            for row in frame.iter_rows(named=True)
        ),
    )
