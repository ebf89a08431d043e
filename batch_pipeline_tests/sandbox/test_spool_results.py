"""A running batch's answers are on disk as they are produced (issue 19), not held until the batch ends: the output
part grows with the lines run while the record holds counts, a restart mid-batch serves the same output, a batch
cancelled after a restart serves its partial output, and a state saved mid-batch by the sandbox that held the
answers as a list (data/state_answers_in_memory, written by 4705068: 40 lines over a 100 s in_progress, its clock a
century ahead of real time so that a restart resumes it there, stopped half-way) loads and finishes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import openai

from batch_pipeline.sandbox import SandboxAdmin, SandboxServer
from batch_pipeline.sandbox.openai.spooled_results import SpooledResults

from .support import chat_line, submit

SAVED_ANSWERS_IN_MEMORY = Path(__file__).parent / "data" / "state_answers_in_memory"
LINES = 400
SLOW = {"sandbox_scenario": "normal", "sandbox_param_in_progress_s": "100"}  # in_progress over 100 clock seconds


def _sdk(server: SandboxServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="sk-sandbox", max_retries=0, timeout=60)


def _lines(count: int) -> list[dict[str, Any]]:
    """Chat requests; every tenth (from the 8th) carries the poison marker, so the errors part has lines too."""
    return [chat_line(f"k{i}", f"ticket {i}" + (" [[sandbox:poison]]" if i % 10 == 7 else "")) for i in range(count)]


def _download(client: openai.OpenAI, file_id: str | None) -> bytes:
    assert file_id is not None
    with client.files.with_streaming_response.content(file_id) as response:
        return b"".join(response.iter_bytes(64 * 1024))


def _ids(data: bytes) -> list[str]:
    return [json.loads(line)["custom_id"] for line in data.splitlines()]


def _running(server: SandboxServer, batch_id: str) -> SpooledResults:
    """The batch's answers so far, checked to be counts and sizes, with every answer run in a part on disk."""
    results = server.app.state.batches[batch_id].results
    assert isinstance(results, SpooledResults)
    held = [value for value in vars(results).values() if isinstance(value, list | tuple | set)]
    assert held == []  # no per-request Python objects
    assert all(not lines for lines in results._pending.values())  # flushed before the state was saved
    parts = {part: results.path(part).read_bytes() for part in ("output", "errors", "billing")}
    assert {part: len(data) for part, data in parts.items()} == results.sizes
    assert len(parts["output"].splitlines()) + len(parts["errors"].splitlines()) == len(results)
    assert len(parts["billing"].splitlines()) == results.totals["succeeded"] == len(parts["output"].splitlines())
    return results


def test_the_answers_of_a_running_batch_grow_on_disk_and_survive_a_restart(tmp_path: Path) -> None:
    lines = _lines(LINES)
    with SandboxServer(port=0, state_dir=str(tmp_path)) as server:
        client, admin = _sdk(server), SandboxAdmin(server.url)
        admin.clock(freeze=True)
        batch_id = submit(client, lines, metadata=SLOW)["id"]
        admin.clock(advance_s=0.05 + 25)  # validated, a quarter through in_progress
        assert client.batches.retrieve(batch_id).status == "in_progress"
        results = _running(server, batch_id)
        quarter, first = len(results), results.path("output").read_bytes()
        assert quarter == LINES // 4 and first
        admin.clock(advance_s=25)
        counts = client.batches.retrieve(batch_id).request_counts
        results = _running(server, batch_id)
        assert len(results) == LINES // 2 == counts.completed + counts.failed
        output_part = results.path("output")
        half = output_part.read_bytes()
        assert half.startswith(first) and len(half) > len(first)  # appended to, not rewritten
        (saved,) = json.loads((tmp_path / "state.json").read_text())["batches"]
        assert saved["results"] == results.to_json() and saved["results"]["count"] == LINES // 2  # not answers
        assert set(saved["requests"]) == {"spooled", "spans", "count"} and saved["order"] is None  # nor spans
        state_doc = json.loads((tmp_path / "state.json").read_text())
        assert "seen_custom_ids" not in state_doc and state_doc["seen_bytes"] > 0  # the sightings are a log
        seen = dict(server.app.state.seen_custom_ids)
        assert len(seen) == LINES // 2
        client.close()
    with output_part.open("ab") as out:  # as if the sandbox answered more and died before saving its state
        out.write(b'{"custom_id":"never-saved"}\n')
    with SandboxServer(port=0, state_dir=str(tmp_path)) as server:
        client, admin = _sdk(server), SandboxAdmin(server.url)
        assert _running(server, batch_id).sizes["output"] == len(half)  # cut back to the saved size
        assert server.app.state.seen_custom_ids == seen  # replayed from the log
        admin.clock(advance_s=100)
        batch = client.batches.retrieve(batch_id)
        assert batch.status == "completed"
        poisoned = [line["custom_id"] for i, line in enumerate(lines) if i % 10 == 7]
        assert batch.request_counts.completed == LINES - len(poisoned) and batch.request_counts.failed == len(poisoned)
        output = _download(client, batch.output_file_id)
        assert output.startswith(half)  # the answers before the restart, unchanged, then the rest
        assert sorted(_ids(output)) == sorted(line["custom_id"] for line in lines if line["custom_id"] not in poisoned)
        assert sorted(_ids(_download(client, batch.error_file_id))) == sorted(poisoned)
        ledger = SandboxAdmin(server.url).ledger()
        assert [row["custom_id"] for row in ledger] == _ids(output)  # billed once each, in output order
        assert sum(row["input_tokens"] for row in ledger) == batch.usage.input_tokens
        assert not list((tmp_path / "files").glob("*.part"))  # the parts became the files or went
        assert not list((tmp_path / "files").glob("*.spans")) and not list((tmp_path / "files").glob("*.input"))
        client.close()


def test_a_batch_cancelled_after_a_restart_serves_its_partial_output(tmp_path: Path) -> None:
    lines = _lines(100)
    with SandboxServer(port=0, state_dir=str(tmp_path)) as server:
        client, admin = _sdk(server), SandboxAdmin(server.url)
        admin.clock(freeze=True)
        batch_id = submit(client, lines, metadata=SLOW)["id"]
        admin.clock(advance_s=0.05 + 30)
        assert client.batches.retrieve(batch_id).status == "in_progress"
        before = _running(server, batch_id).path("output").read_bytes()
        client.close()
    with SandboxServer(port=0, state_dir=str(tmp_path)) as server:
        client, admin = _sdk(server), SandboxAdmin(server.url)
        admin.clock(freeze=True)
        assert client.batches.cancel(batch_id).status == "cancelling"
        admin.clock(advance_s=1)
        batch = client.batches.retrieve(batch_id)
        assert batch.status == "cancelled"
        output = _download(client, batch.output_file_id)
        assert output.startswith(before)
        errors = [json.loads(line) for line in _download(client, batch.error_file_id).splitlines()]
        unrun = [e["custom_id"] for e in errors if e["response"] is None]
        assert {e["error"]["code"] for e in errors if e["response"] is None} == {"batch_cancelled"}
        ran = _ids(output) + [e["custom_id"] for e in errors if e["response"] is not None]
        assert len(ran) >= 30 and len(unrun) == 100 - len(ran)
        assert sorted(ran + unrun) == sorted(line["custom_id"] for line in lines)
        assert batch.request_counts.completed == len(_ids(output)) and batch.request_counts.failed == 100 - len(
            _ids(output)
        )
        assert not list((tmp_path / "files").glob("*.part"))
        client.close()


def test_a_state_saved_with_the_answers_in_memory_still_loads(tmp_path: Path) -> None:
    """The sandbox of 4705068 saved a running batch with its 20 answers so far as a list in state.json: they become
    the batch's parts on load, first in its output, and the batch runs the other 20 and completes."""
    shutil.copytree(SAVED_ANSWERS_IN_MEMORY, tmp_path / "state")
    (old_batch,) = json.loads((tmp_path / "state" / "state.json").read_text())["batches"]
    assert old_batch["status"] == "in_progress" and len(old_batch["results"]) == 20
    with SandboxServer(port=0, state_dir=str(tmp_path / "state")) as server:
        client, admin = _sdk(server), SandboxAdmin(server.url)
        admin.clock(freeze=True)
        assert len(_running(server, old_batch["id"])) == 20
        admin.clock(advance_s=100)
        batch = client.batches.retrieve(old_batch["id"])
        assert batch.status == "completed" and batch.request_counts.total == 40
        output = [json.loads(line) for line in _download(client, batch.output_file_id).splitlines()]
        saved_ok = [r for r in old_batch["results"] if r["status_code"] == 200]
        assert [line["response"]["body"] for line in output[: len(saved_ok)]] == [r["body"] for r in saved_ok]
        errors = _ids(_download(client, batch.error_file_id))
        assert sorted(errors) == sorted(f"k{i}" for i in range(40) if i % 10 == 7)
        assert sorted(line["custom_id"] for line in output) == sorted(f"k{i}" for i in range(40) if i % 10 != 7)
        assert len(admin.ledger()) == len(output)
        client.close()
    resaved = json.loads((tmp_path / "state" / "state.json").read_text())["batches"][0]
    assert resaved["results"] == [] and resaved["totals"]["succeeded"] == len(output)  # finished, compacted
