"""Vertex AI batch prediction jobs answer to disk (issue 19) and give back, byte for byte, what they gave when their
requests and prediction lines were held in memory: ``data/results_before_vertex_spool`` was written by
``spool_fixture.py --vertex`` on 9d3741f, and the same fixed job run here (clock frozen, real google-genai and
google-cloud-storage clients on a loopback GCS emulator) must match it, output objects, stats and ledger rows,
straight through or across a restart half-way; a state that sandbox saved half-way still loads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from batch_pipeline.sandbox import SandboxAdmin, SandboxServer
from batch_pipeline.sandbox.google.vertex_answers import VertexAnswers
from batch_pipeline.sandbox.scenarios import make_scenario
from batch_pipeline.sandbox.spooled_lines import SpooledLines

from ..spool_fixture import COUNT, VertexBatch, fixed_clock, gcs_emulator, generate_vertex

DATA = Path(__file__).parent.parent / "data"
BEFORE = DATA / "results_before_vertex_spool"
SAVED_LINES_IN_MEMORY = DATA / "state_vertex_answers_in_memory"
PREDICTIONS = "vertex.predictions.jsonl"


def test_the_output_objects_and_ledger_are_byte_identical_to_the_in_memory_sandbox() -> None:
    outputs = generate_vertex()
    expected = {path.name: path.read_bytes() for path in sorted(BEFORE.iterdir())}
    assert sorted(outputs) == sorted(expected)
    for name, data in expected.items():
        assert outputs[name] == data, name


def _running(server: SandboxServer, job: VertexBatch) -> VertexAnswers:
    """The running job's answers so far, checked to be counts and sizes (no line, no request held), every answer
    in the predictions part on disk and every succeeded one in the billing part."""
    record = server.app.state.vertex.get(job.name.rsplit("/", 1)[-1])
    answers, requests = record.results, record.requests
    assert isinstance(answers, VertexAnswers) and isinstance(requests, SpooledLines)
    assert [v for v in vars(answers).values() if isinstance(v, list | tuple | set)] == []
    assert not isinstance(record.order, list) and all(not lines for lines in answers._pending.values())
    assert {part: answers.path(part).stat().st_size for part in answers.sizes} == answers.sizes
    assert len(answers.path("predictions").read_bytes().splitlines()) == len(answers)
    assert len(answers.path("billing").read_bytes().splitlines()) == answers.totals["succeeded"]
    return answers


def _without(rows: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k != key} for row in rows]


def _lines(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in data.splitlines()]


def _stepped_run(state_dir: Path, restart: bool) -> tuple[dict[str, bytes], list[dict[str, Any]]]:
    """The fixed job over 100 clock seconds, advanced a quarter, a half, then to its end; with ``restart``, the
    sandbox is restarted on its state directory at the half (its parts holding lines produced after its last save,
    as if it died before saving them). Its outputs and ledger."""
    slow = make_scenario("normal", {"in_progress_s": 100})
    with gcs_emulator(), SandboxServer(port=0, state_dir=str(state_dir), scenario=slow) as server:
        fixed_clock(server)
        admin = SandboxAdmin(server.url)
        job = VertexBatch(server.url)
        admin.clock(advance_s=0.05 + 25)
        quarter = _running(server, job)
        assert len(quarter) == COUNT // 4
        first = quarter.path("predictions").read_bytes()
        admin.clock(advance_s=25)
        half = _running(server, job)
        grown = half.path("predictions").read_bytes()
        assert len(half) == COUNT // 2 and grown.startswith(first) and len(grown) > len(first)
        (saved,) = json.loads((state_dir / "state.json").read_text())["vertex_jobs"]  # names and counts
        assert saved["results"] == half.to_json() and saved["order"] is None and "lines" not in saved
        assert (
            set(saved["requests"]) == {"spooled", "spans", "count", "columns"} and saved["requests"]["count"] == COUNT
        )
        assert admin.ledger() == []  # nothing billed before the job ends
        sizes, paths = dict(half.sizes), [half.path(part) for part in half.sizes]
        if restart:
            server.stop()
            for path in paths:
                with path.open("ab") as out:
                    out.write(b'{"never":"saved"}\n')
            server = SandboxServer(port=0, state_dir=str(state_dir), scenario=slow).start()
            job.attach(server.url)
            admin = SandboxAdmin(server.url)
            assert dict(_running(server, job).sizes) == sizes  # cut back
        try:
            admin.clock(advance_s=100)
            outputs, ledger = job.outputs(), admin.ledger()
        finally:
            server.stop()
    files = state_dir / "files"
    assert not list(files.glob("*.part")) and not list(files.glob("*.spans")) and not list(files.glob("*.requests"))
    return outputs, ledger


def test_a_running_job_answers_to_disk_and_resumes_after_a_restart(tmp_path: Path) -> None:
    """Prediction lines grow in a part on disk while the job holds counts; a sandbox restarted half-way cuts the
    parts back to its last save and finishes with the very bytes of a run that was not restarted, each succeeded
    request billed once; both are the in-memory sandbox's lines (but for when each was processed, which follows
    the clock steps)."""
    outputs, ledger = _stepped_run(tmp_path / "restarted", restart=True)
    straight, straight_ledger = _stepped_run(tmp_path / "straight", restart=False)
    assert outputs == straight and ledger == straight_ledger
    expected = _lines((BEFORE / PREDICTIONS).read_bytes())
    assert _without(_lines(outputs[PREDICTIONS]), "processed_time") == _without(expected, "processed_time")
    before = json.loads((BEFORE / "vertex.ledger.json").read_text())
    assert _without(ledger, "billed_at") == _without(before, "billed_at")
    assert json.loads(outputs["vertex.job.json"])[2] == json.loads((BEFORE / "vertex.job.json").read_bytes())[2]


def test_a_state_saved_with_the_lines_in_memory_still_loads(tmp_path: Path) -> None:
    """The sandbox of 9d3741f saved a job half-way with its requests, its 10 prediction lines and their billing
    rows as lists in state.json (data/state_vertex_answers_in_memory, ``spool_fixture.py --vertex-midway``): they
    become spooled requests and parts on load, the saved lines first in the output, and the job runs the other 10
    and ends, each succeeded request billed once."""
    shutil.copytree(SAVED_LINES_IN_MEMORY, tmp_path / "state")
    (saved,) = json.loads((tmp_path / "state" / "state.json").read_text())["vertex_jobs"]
    assert len(saved["lines"]) == 10 and len(saved["billing"]) == 8 and len(saved["requests"]) == 20
    name = f"projects/{saved['project']}/locations/{saved['location']}/batchPredictionJobs/{saved['id']}"
    with gcs_emulator(), SandboxServer(port=0, state_dir=str(tmp_path / "state")) as server:
        job = VertexBatch(server.url, name=name)  # the output bucket, on this emulator
        answers = _running(server, job)
        assert len(answers) == 10 and answers.totals["succeeded"] == 8
        admin = SandboxAdmin(server.url)
        admin.clock(advance_s=100)
        outputs, ledger = job.outputs(), admin.ledger()
    lines = _lines(outputs[PREDICTIONS])
    assert len(lines) == 20 and lines[:10] == saved["lines"]
    state, _, stats = json.loads(outputs["vertex.job.json"])
    ok = [line for line in lines if not line["status"]]
    assert state == "JOB_STATE_SUCCEEDED" and stats["successful_count"] == len(ok) == len(ledger)
    assert _without(ledger[:8], "billed_at") == _without(saved["billing"], "billed_at")  # billed once each
    assert len({row["custom_id"] for row in ledger}) == len(ledger)
    assert not list((tmp_path / "state" / "files").glob("*.part"))


def _spooled(spool: Path) -> list[str]:
    """The jobs' files in the spool (requests, their spans and the parts)."""
    return sorted(path.name for path in spool.iterdir() if path.suffix in (".requests", ".spans", ".part"))


def test_a_reset_or_a_delete_takes_the_jobs_spool_files_with_it() -> None:
    """A running job's requests and parts are in the spool; they go when it ends (it keeps counts), when it is
    cancelled and deleted, and when the sandbox resets."""
    slow = make_scenario("normal", {"in_progress_s": 100})
    with gcs_emulator(), SandboxServer(port=0, scenario=slow) as server:
        spool, admin = server.app.state.spool.root, SandboxAdmin(server.url)
        admin.clock(freeze=True)
        job = VertexBatch(server.url)
        job_id = job.name.rsplit("/", 1)[-1]
        admin.clock(advance_s=50)
        assert 0 < len(_running(server, job)) < COUNT
        assert {path.name for path in spool.glob(f"{job_id}.*")} == {
            f"{job_id}.requests",
            f"{job_id}.predictions.part",
            f"{job_id}.billing.part",
        }
        admin.clock(advance_s=100)
        assert job.genai.batches.get(name=job.name).state.name == "JOB_STATE_SUCCEEDED"
        assert not list(spool.glob(f"{job_id}.*"))  # ended: its counts only
        stats = job.genai.batches.get(name=job.name).completion_stats
        assert (stats.successful_count or 0) + (stats.failed_count or 0) == COUNT
        job.genai.batches.delete(name=job.name)
        cancelled = VertexBatch(server.url)
        admin.clock(advance_s=50)
        assert len(_spooled(spool)) == 3  # requests, predictions and billing parts
        job.genai.batches.cancel(name=cancelled.name)
        admin.clock(advance_s=100)
        job.genai.batches.delete(name=cancelled.name)
        assert _spooled(spool) == []
        VertexBatch(server.url)
        admin.clock(advance_s=50)
        assert len(_spooled(spool)) == 3
        admin.reset()
        assert _spooled(spool) == []
