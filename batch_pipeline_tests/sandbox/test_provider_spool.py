"""Anthropic, Gemini and Bedrock batches answer to disk (issue 19) and give back, byte for byte, what they gave when
their answers were held in memory: ``data/results_before_provider_spool`` was written by ``spool_fixture.py``
against the sandbox of 267acb1, and the same fixed batches run here (ids counted, clock frozen at a fixed time) must
match it, results files, output objects and ledger rows (billing unchanged), straight through or across a restart
half-way; a state that sandbox saved half-way still loads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from batch_pipeline.sandbox import SandboxAdmin, SandboxServer, ids
from batch_pipeline.sandbox.bedrock import api as bedrock_api
from batch_pipeline.sandbox.scenarios import make_scenario
from batch_pipeline.sandbox.spooled_lines import SpooledLines
from batch_pipeline.sandbox.spooled_parts import SpooledParts

from .spool_fixture import COUNT, Batches, CountingSecrets, anthropic_requests, fixed_clock, generate

BEFORE = Path(__file__).parent / "data" / "results_before_provider_spool"
SAVED_ANSWERS_IN_MEMORY = Path(__file__).parent / "data" / "state_provider_answers_in_memory"


def test_results_files_are_byte_identical_to_the_in_memory_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    counting = CountingSecrets()
    monkeypatch.setattr(ids, "secrets", counting)
    monkeypatch.setattr(bedrock_api, "secrets", counting)
    outputs = generate()
    expected = {path.name: path.read_bytes() for path in sorted(BEFORE.iterdir())}
    assert sorted(outputs) == sorted(expected)
    for name, data in expected.items():
        assert outputs[name] == data, name


def _running(server: SandboxServer, batches: Batches) -> dict[str, SpooledParts]:
    """Each provider's running batch's answers so far, checked to be counts and sizes (no answer object, no
    request dict held), with every answer in a part on disk."""
    state = server.app.state
    records = {
        "anthropic": state.anthropic.get(batches.anthropic_id),
        "gemini": state.gemini.get(batches.gemini_name.removeprefix("batches/")),
        "bedrock": state.bedrock.get(batches.arn.rsplit("/", 1)[-1]),
    }
    out = {}
    for name, record in records.items():
        answers, requests = record.results, getattr(record, record.REQUESTS)
        assert isinstance(answers, SpooledParts) and isinstance(requests, SpooledLines), name
        assert [v for v in vars(answers).values() if isinstance(v, list | tuple | set)] == []
        assert all(not lines for lines in answers._pending.values())  # flushed before the state was saved
        on_disk = {part: answers.path(part).stat().st_size for part in answers.sizes}
        assert on_disk == answers.sizes, name
        lines = sum(len(answers.path(part).read_bytes().splitlines()) for part in answers.sizes if part != "billing")
        assert (
            lines == len(answers)
            and len(answers.path("billing").read_bytes().splitlines()) == answers.totals["succeeded"]
        )
        out[name] = answers
    return out


def _without_billed_at(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k != "billed_at"} for row in rows]


def test_running_batches_answer_to_disk_and_resume_after_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Anthropic, Gemini and Bedrock batches over 100 clock seconds: their answers grow in parts on disk while
    the records hold counts; a sandbox restarted on the state directory half-way (its parts holding answers it
    produced after its last save) cuts them back, finishes, and gives back the very bytes of the in-memory
    sandbox's uninterrupted run, each succeeded request billed once."""
    counting = CountingSecrets()
    monkeypatch.setattr(ids, "secrets", counting)
    monkeypatch.setattr(bedrock_api, "secrets", counting)
    slow = make_scenario("normal", {"in_progress_s": 100})  # given at start: a request would count an id
    with SandboxServer(port=0, state_dir=str(tmp_path), scenario=slow) as server:
        fixed_clock(server)
        admin = SandboxAdmin(server.url)
        batches = Batches(server.url)
        admin.clock(advance_s=0.05 + 25)
        quarter = {
            name: (len(a), a.path(a.PARTS[0] if a.PARTS else "out0").read_bytes())
            for name, a in _running(server, batches).items()
        }
        assert {count for count, _ in quarter.values()} == {COUNT // 4}
        admin.clock(advance_s=25)
        half = _running(server, batches)
        for name, answers in half.items():
            first = answers.path(answers.PARTS[0] if answers.PARTS else "out0").read_bytes()
            assert (
                len(answers) == COUNT // 2 and first.startswith(quarter[name][1]) and len(first) > len(quarter[name][1])
            )
        saved = {name: dict(answers.sizes) for name, answers in half.items()}
        state = json.loads((tmp_path / "state.json").read_text())
        records = [*state["anthropic_batches"], *state["gemini"]["batches"], *state["bedrock_jobs"]]
        for record, answers in zip(records, half.values(), strict=True):  # names and counts, not lines
            assert record["results"] == answers.to_json() and record["order"] is None
            requests = record.get("requests", record.get("records"))
            assert set(requests) == {"spooled", "spans", "count", "columns"} and requests["count"] == COUNT
        paths = {name: [answers.path(part) for part in answers.sizes] for name, answers in half.items()}
        assert admin.ledger() == []  # nothing billed before a batch ends
    for parts in paths.values():  # as if the sandbox answered more and died before saving its state
        for path in parts:
            with path.open("ab") as out:
                out.write(b'{"never":"saved"}\n')
    with SandboxServer(port=0, state_dir=str(tmp_path), scenario=slow) as server:
        batches.attach(server.url)
        admin = SandboxAdmin(server.url)
        resumed = _running(server, batches)
        assert {name: dict(answers.sizes) for name, answers in resumed.items()} == saved  # cut back
        admin.clock(advance_s=100)
        outputs = batches.outputs()
        ledger = admin.ledger()
    for name, data in outputs.items():
        assert data == (BEFORE / name).read_bytes(), name
    before = json.loads((BEFORE / "ledger.json").read_text())
    assert _without_billed_at(ledger) == _without_billed_at(before)  # billed once each, as before
    files = tmp_path / "files"
    assert not list(files.glob("*.part")) and not list(files.glob("*.spans"))
    (kept,) = files.glob("*.requests")  # an ended Anthropic batch keeps the requests it was sent, on disk
    assert [json.loads(line) for line in kept.read_text().splitlines()] == anthropic_requests()


def test_a_state_saved_with_the_answers_in_memory_still_loads(tmp_path: Path) -> None:
    """The sandbox of 267acb1 saved an Anthropic batch, a Gemini file batch and a Bedrock job half-way, each with
    its requests and its 10 answers so far as lists in state.json (data/state_provider_answers_in_memory,
    ``spool_fixture.py --midway``): they become spooled requests and parts on load, the saved answers first in the
    results, and the batches run the other 10 and end, each succeeded request billed once."""
    shutil.copytree(SAVED_ANSWERS_IN_MEMORY, tmp_path / "state")
    saved = json.loads((tmp_path / "state" / "state.json").read_text())
    (anthropic,), (job,) = saved["anthropic_batches"], saved["bedrock_jobs"]
    (gemini,) = saved["gemini"]["batches"]
    assert [len(b["results"]) for b in (anthropic, gemini, job)] == [10, 10, 10]
    with SandboxServer(port=0, state_dir=str(tmp_path / "state")) as server:
        batches = Batches.existing(server.url, anthropic["id"], f"batches/{gemini['id']}", job["arn"])
        assert [len(answers) for answers in _running(server, batches).values()] == [10, 10, 10]
        admin = SandboxAdmin(server.url)
        admin.clock(advance_s=100)
        outputs = batches.outputs()
        ledger = admin.ledger()
    files = {name: [json.loads(line) for line in outputs[name].splitlines()] for name in outputs}
    saved_lines = {
        "anthropic.jsonl": [{"custom_id": r["custom_id"], "result": r["result"]} for r in anthropic["results"]],
        "gemini.jsonl": [
            {"key": r["key"], "response": r["response"]} if r["response"] else {"key": r["key"], "error": r["error"]}
            for r in gemini["results"]
        ],
        "bedrock.records.jsonl.out": [r["output"] for r in job["results"]],
    }
    for name, lines in saved_lines.items():
        assert len(files[name]) == 20 and files[name][:10] == lines, name
    manifest = files["bedrock.manifest.json.out"][0]
    assert manifest["processedRecordCount"] == 20
    ok = [line["custom_id"] for line in files["anthropic.jsonl"] if line["result"]["type"] == "succeeded"]
    ok += [line["key"] for line in files["gemini.jsonl"] if "response" in line]
    ok += [line["recordId"] for line in files["bedrock.records.jsonl.out"] if "modelOutput" in line]
    assert sorted(row["custom_id"] for row in ledger) == sorted(ok)  # billed once each
    assert not list((tmp_path / "state" / "files").glob("*.part"))


def test_a_reset_or_a_delete_takes_the_batches_spool_files_with_it(tmp_path: Path) -> None:
    """Running batches' requests and parts, and an ended Anthropic batch's results file and requests, go with the
    batch."""
    slow = make_scenario("normal", {"in_progress_s": 100})
    with SandboxServer(port=0, scenario=slow) as server:
        spool, admin = server.app.state.spool.root, SandboxAdmin(server.url)
        admin.clock(freeze=True)
        batches = Batches(server.url)
        admin.clock(advance_s=50)
        assert len(_running(server, batches)) == 3 and list(spool.glob("*.part")) and list(spool.glob("*.requests"))
        admin.clock(advance_s=100)
        ended = batches.sdk.messages.batches.retrieve(batches.anthropic_id)
        assert ended.processing_status == "ended" and list(spool.glob("*.results.jsonl"))
        assert not list(spool.glob("*.part")) and not list(spool.glob("*.spans"))  # ended: compacted
        assert [path.name for path in spool.glob("*.requests")] == [f"{batches.anthropic_id}.requests"]  # as sent
        batches.sdk.messages.batches.delete(batches.anthropic_id)
        assert not list(spool.glob("*.results.jsonl")) and not list(spool.glob("*.requests"))
        Batches(server.url)
        admin.clock(advance_s=50)
        assert list(spool.glob("*.part")) and list(spool.glob("*.requests"))
        admin.reset()
        assert not list(spool.glob("*.part")) and not list(spool.glob("*.requests*"))
