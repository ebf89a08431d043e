"""The spool (issue 19): file bodies, output files and the ledger live on disk, not in the sandbox's memory, and
a state directory saved before the spool still loads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import openai

from batch_pipeline.sandbox import SandboxAdmin, SandboxServer
from batch_pipeline.sandbox.ledger import LEDGER_FILE
from batch_pipeline.sandbox.openai.spooled_requests import SpooledRequests

from .support import chat_line, submit, to_jsonl, wait_for

SAVED_BEFORE_SPOOL = Path(__file__).parent / "data" / "state_before_spool"
LINES = 3000


def _sdk(server: SandboxServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="sk-sandbox", max_retries=0, timeout=60)


def _download(client: openai.OpenAI, file_id: str) -> bytes:
    with client.files.with_streaming_response.content(file_id) as response:
        return b"".join(response.iter_bytes(64 * 1024))


def test_a_large_upload_and_its_output_go_through_the_spool() -> None:
    server = SandboxServer(port=0).start()
    state = server.app.state
    spool = state.spool.root
    try:
        client = _sdk(server)
        lines = [chat_line(f"row-{i}", f"ticket {i}: " + "my invoice is wrong " * 20) for i in range(LINES)]
        data = to_jsonl(lines)
        batch = wait_for(client, submit(client, lines)["id"], timeout=60)
        assert batch["status"] == "completed" and batch["request_counts"]["completed"] == LINES
        upload = state.files[batch["input_file_id"]]
        assert upload.path == spool / upload.id and upload.path.read_bytes() == data and upload.size == len(data)
        assert not any(isinstance(value, bytes) for value in vars(upload).values())  # a path, not the bytes
        output = state.files[batch["output_file_id"]]
        assert output.path.parent == spool and output.size > 1024 * 1024  # more than one download chunk
        assert _download(client, output.id) == output.path.read_bytes()
        got = [json.loads(line) for line in output.path.read_bytes().splitlines()]
        assert sorted(line["custom_id"] for line in got) == sorted(line["custom_id"] for line in lines)
        record = state.batches[batch["id"]]
        assert record.requests == [] and record.results == [] and record.totals is not None  # compacted
        assert client.batches.retrieve(batch["id"]).usage.input_tokens == batch["usage"]["input_tokens"]
        ledger_rows = (spool / LEDGER_FILE).read_text().splitlines()
        assert len(ledger_rows) == LINES == len(state.ledger)
        admin = SandboxAdmin(server.url)
        assert admin.ledger(offset=10, limit=5) == [json.loads(row) for row in ledger_rows[10:15]]
        assert state.ledger.totals["input_tokens"] == batch["usage"]["input_tokens"]
        client.close()
    finally:
        server.stop()
    assert not spool.exists()  # a temporary spool goes with the sandbox


def test_a_state_saved_before_the_spool_still_loads(tmp_path: Path) -> None:
    """The saved state of the sandbox before the spool (its ledger a list inside state.json, its finished batch
    with every request and result) loads: the same batch, files and ledger, and billing goes on from there."""
    shutil.copytree(SAVED_BEFORE_SPOOL, tmp_path / "state")
    saved = json.loads((tmp_path / "state" / "state.json").read_text())
    (old_batch,) = saved["batches"]
    with SandboxServer(port=0, state_dir=str(tmp_path / "state")) as server:
        client = _sdk(server)
        batch = client.batches.retrieve(old_batch["id"])
        assert batch.status == "completed" and batch.request_counts.completed == len(old_batch["results"])
        assert batch.usage.input_tokens == sum(r["input_tokens"] for r in old_batch["results"])
        blob = tmp_path / "state" / "files" / batch.output_file_id
        assert _download(client, batch.output_file_id) == blob.read_bytes()
        admin = SandboxAdmin(server.url)
        assert admin.ledger() == saved["ledger"]
        wait_for(client, submit(client, [chat_line("new", "one more")])["id"])
        assert len(admin.ledger()) == len(saved["ledger"]) + 1
        client.close()
    resaved = json.loads((tmp_path / "state" / "state.json").read_text())
    assert "ledger" not in resaved and resaved["ledger_bytes"] > 0  # written the new way from now on
    with SandboxServer(port=0, state_dir=str(tmp_path / "state")) as server:
        entries = SandboxAdmin(server.url).ledger()
        assert entries[: len(saved["ledger"])] == saved["ledger"] and entries[-1]["custom_id"] == "new"
    assert (tmp_path / "state" / "files").is_dir()  # a state directory stays after the sandbox stops


def test_a_batch_in_flight_reads_its_requests_from_the_spool_across_a_restart(tmp_path: Path) -> None:
    """Mid-batch the record holds byte spans into a hard link of the input, not parsed requests; deleting the
    input file and restarting the sandbox from its state directory do not lose them."""
    lines = [chat_line(f"k{i}", f"text {i}") for i in range(40)]
    with SandboxServer(port=0, state_dir=str(tmp_path)) as server:
        client = _sdk(server)
        SandboxAdmin(server.url).clock(freeze=True)
        batch_id = submit(client, lines)["id"]
        SandboxAdmin(server.url).clock(advance_s=0.05 + 0.1)  # validated, half-way through in_progress
        assert client.batches.retrieve(batch_id).status == "in_progress"
        record = server.app.state.batches[batch_id]
        assert isinstance(record.requests, SpooledRequests) and 0 < len(record.results) < len(lines)
        assert record.requests.path == tmp_path / "files" / f"{batch_id}.input"
        assert record.requests[3]["custom_id"] == "k3" and record.requests[3]["body"] == lines[3]["body"]
        client.files.delete(record.input_file_id)
        client.close()
    with SandboxServer(port=0, state_dir=str(tmp_path)) as server:
        client = _sdk(server)
        SandboxAdmin(server.url).clock(advance_s=1.0)
        batch = client.batches.retrieve(batch_id)
        assert batch.status == "completed" and batch.request_counts.completed == len(lines)
        output = _download(client, batch.output_file_id).splitlines()
        assert sorted(json.loads(line)["custom_id"] for line in output) == sorted(f"k{i}" for i in range(40))
        assert not (tmp_path / "files" / f"{batch_id}.input").exists()  # the link goes when the batch ends
        client.close()
