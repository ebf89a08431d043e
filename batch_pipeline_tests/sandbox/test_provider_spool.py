"""The Anthropic, Gemini and Bedrock batches give back, byte for byte, what they gave when their answers were held
in memory: ``data/results_before_provider_spool`` was written by ``spool_fixture.py`` against the sandbox of
267acb1, and the same fixed batches run here (ids counted, clock frozen at a fixed time) must match it, results
files, output objects and ledger rows (billing unchanged)."""

from __future__ import annotations

from pathlib import Path

import pytest

from batch_pipeline.sandbox import ids
from batch_pipeline.sandbox.bedrock import api as bedrock_api

from .spool_fixture import CountingSecrets, generate

BEFORE = Path(__file__).parent / "data" / "results_before_provider_spool"


def test_results_files_are_byte_identical_to_the_in_memory_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    counting = CountingSecrets()
    monkeypatch.setattr(ids, "secrets", counting)
    monkeypatch.setattr(bedrock_api, "secrets", counting)
    outputs = generate()
    expected = {path.name: path.read_bytes() for path in sorted(BEFORE.iterdir())}
    assert sorted(outputs) == sorted(expected)
    for name, data in expected.items():
        assert outputs[name] == data, name
