"""The ledger's and the billing part's rows written by template are the bytes the generic encoder wrote."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from batch_pipeline.sandbox.ledger import Ledger, row_json
from batch_pipeline.sandbox.openai.spooled_results import SpooledResults
from batch_pipeline.sandbox.spooled_parts import encode
from batch_pipeline.sandbox.store import BilledTokens

TOKENS = BilledTokens(input_tokens=230, cached_tokens=0, output_tokens=7)
ROWS = [
    TOKENS.ledger_row("openai", "batch_1", "r1", "gpt-4o-mini", 1_700_000_000.123456),
    TOKENS.ledger_row("azure_openai", "b \u00e9", 'c "\u2603"\\', None, 1e22),
    TOKENS.ledger_row("openai", "b", "c", "m", 5),  # an int time: the generic way
    TOKENS.ledger_row("openai", "b", "c", "m", float("inf")),  # not finite: the generic way
    TOKENS.ledger_row("anthropic", "b", "c", "m", 2.5, cache_creation_input_tokens=3),  # a provider's own count
    {"provider": "openai", "custom_id": "c"},  # another shape
]


@pytest.mark.parametrize("row", ROWS)
def test_ledger_line_is_the_encoded_row(row: dict[str, Any]) -> None:
    assert row_json(row) == json.dumps(row, ensure_ascii=False, separators=(",", ":"))


def test_ledger_file_reads_back_its_rows(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.jsonl")
    ledger.extend(ROWS[:3])
    assert list(ledger) == ROWS[:3]
    assert ledger.totals["input_tokens"] == 3 * 230


def test_billing_rows_are_read_back_as_written(tmp_path: Path) -> None:
    parts = SpooledResults(tmp_path, "batch_x")
    parts.add_billing("r \u00e9 1", TOKENS)
    parts.add_billing("r2", BilledTokens(input_tokens=1, cached_tokens=2, output_tokens=3), model="m", extra=4)
    parts.flush()
    lines = parts.path("billing").read_text(encoding="utf-8").splitlines()
    assert lines == [encode(["r \u00e9 1", 230, 0, 7]), encode(["r2", 1, 2, 3, "m", {"extra": 4}])]
    rows = list(parts.billing("openai", "gpt-4o-mini", 9.5))
    assert rows[0] == TOKENS.ledger_row("openai", "batch_x", "r \u00e9 1", "gpt-4o-mini", 9.5)
    assert rows[1]["model"] == "m" and rows[1]["extra"] == 4
