"""Vertex AI batch prediction jobs and their clock-driven lifecycle (advanced lazily, never by a thread).

JOB_STATE_PENDING -> RUNNING (after ``validating_s``) -> SUCCEEDED (``finalizing_s`` after the last request);
RUNNING -> CANCELLING -> CANCELLED; RUNNING -> EXPIRED after 24 h, or at the end of the run under the ``expire``
scenario (its ``complete_share`` processed); under ``partial`` only ``complete_share`` of the requests are
processed and the job ends JOB_STATE_PARTIALLY_SUCCEEDED; a job whose input cannot be read ends FAILED.

The input is read from the GCS emulator when the job is created; when the job ends, every processed request's
prediction line goes to ``{outputUriPrefix}/prediction-model-<time>/predictions.jsonl`` and ``outputInfo`` names
that directory (completed rows are kept on cancel and expiry, as Vertex exports them). Succeeded requests are
billed once, at the end; the ledger's ``custom_id`` is the request ID the line's label carries (decoded from
base32), else the label itself, else a digest of the request's contents.

A job's requests and prediction lines are in the spool (``vertex_answers``), not in memory: it holds their spans,
its processing order and counts while it runs, and its counts only once it ended.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self

from batch_pipeline.sandbox.batches import lines_due
from batch_pipeline.sandbox.google.errors import RPC_CODES, STATUS_NAMES, GoogleError
from batch_pipeline.sandbox.google.responder import GeminiResponder
from batch_pipeline.sandbox.google.vertex_answers import PREDICTIONS, VertexAnswer, VertexAnswers, spool_input
from batch_pipeline.sandbox.google.vertex_gcs import GcsUnavailable, SandboxGcs
from batch_pipeline.sandbox.ids import stable_hex
from batch_pipeline.sandbox.quotas import Load, LoadBook
from batch_pipeline.sandbox.scenarios import Scenario
from batch_pipeline.sandbox.spooled_lines import SpooledLines
from batch_pipeline.sandbox.spooled_parts import bill_rows
from batch_pipeline.sandbox.spooled_record import SpooledRecord, SpooledStore
from batch_pipeline.sandbox.store import Bill, rfc3339

EXPIRY_S = 24 * 3600
ID_LABEL = "batch_pipeline_rid"
TERMINAL = frozenset(
    {
        "JOB_STATE_SUCCEEDED",
        "JOB_STATE_PARTIALLY_SUCCEEDED",
        "JOB_STATE_FAILED",
        "JOB_STATE_CANCELLED",
        "JOB_STATE_EXPIRED",
    }
)
REASON_PHRASES = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}
INVALID_ARGUMENT, NOT_FOUND = 3, 5  # google.rpc.Code numbers, as a job's ``error`` carries them
HTTP_OF_RPC = {rpc: http for http, rpc in sorted(RPC_CODES.items(), reverse=True)}


def line_key(request: dict[str, Any]) -> str:
    """The request ID a line carries in its labels (see the module docstring)."""
    labels = request.get("labels") if isinstance(request.get("labels"), dict) else {}
    label = labels.get(ID_LABEL)
    if isinstance(label, str) and label:
        try:
            raw = base64.b32decode(label.upper() + "=" * (-len(label) % 8))
            if len(raw) == 32:
                return raw.hex()
        except (binascii.Error, ValueError):
            pass
        return label
    canonical = json.dumps(request.get("contents"), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


@dataclass
class VertexJob(SpooledRecord):
    """All the sandbox knows about one batch prediction job. Times are clock seconds."""

    PARTS_TYPE = VertexAnswers

    id: str
    project: str
    location: str
    display_name: str
    model: str
    input_config: dict[str, Any]
    output_config: dict[str, Any]
    created_at: float
    scenario: Scenario
    requests: list[dict[str, Any]] | SpooledLines  # spooled at create (a list in a state saved before the spool)
    order: Any  # the processing order: the spooled requests' ``order`` column, or a list
    state: str = "JOB_STATE_PENDING"
    results: list[VertexAnswer] | VertexAnswers = field(default_factory=list)  # its prediction lines so far
    started_at: float | None = None
    ended_at: float | None = None
    cancel_at: float | None = None
    updated_at: float | None = None
    error: dict[str, Any] | None = None
    output_dir: str | None = None
    totals: dict[str, int] | None = None  # once ended: its requests, lines and succeeded lines

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        """Inverse of ``to_json``; a job saved before the spool has its prediction ``lines`` and unbilled
        ``billing`` rows as lists (they become its answers, then its parts)."""
        data = dict(data)
        if "lines" in data:
            data["results"] = VertexAnswer.saved(data.pop("lines"), data.pop("billing", None) or [])
        return super().from_json(data)

    @property
    def ended(self) -> bool:
        return self.state in TERMINAL

    def sums(self, answers: list[Any]) -> dict[str, int]:
        return {"succeeded": sum(1 for answer in answers if not answer.line["status"])}

    @property
    def name(self) -> str:
        return f"projects/{self.project}/locations/{self.location}/batchPredictionJobs/{self.id}"

    @property
    def answers(self) -> VertexAnswers:
        """Its prediction lines so far (spooled from its create or load until it ends)."""
        assert isinstance(self.results, VertexAnswers), "a job's answers are spooled from its create or load"
        return self.results

    def counts(self) -> dict[str, str]:
        """``completionStats`` (int64 fields, which REST JSON writes as strings)."""
        tally = self.tally()
        ok, processed = tally["succeeded"], tally["processed"]
        incomplete = tally["requests"] - processed
        return {"successfulCount": str(ok), "failedCount": str(processed - ok), "incompleteCount": str(incomplete)}

    def to_api(self) -> dict[str, Any]:
        """The REST ``BatchPredictionJob`` resource."""
        body: dict[str, Any] = {
            "name": self.name,
            "displayName": self.display_name,
            "model": self.model,
            "inputConfig": self.input_config,
            "outputConfig": self.output_config,
            "state": self.state,
            "createTime": rfc3339(self.created_at),
            "updateTime": rfc3339(self.updated_at or self.created_at),
            "completionStats": self.counts(),
        }
        if self.started_at is not None:
            body["startTime"] = rfc3339(self.started_at)
        if self.ended_at is not None:
            body["endTime"] = rfc3339(self.ended_at)
        if self.error is not None:
            body["error"] = self.error
        if self.output_dir is not None:
            body["outputInfo"] = {"gcsOutputDirectory": self.output_dir}
        return body


class VertexJobs(SpooledStore[VertexJob]):
    """The batch prediction jobs of one sandbox (callers hold the state lock); their files in ``spool``."""

    record_type = VertexJob

    def __init__(
        self,
        responder: GeminiResponder,
        bill: Bill,
        spool: Path,
        gcs: SandboxGcs | None = None,
        load: LoadBook | None = None,
    ) -> None:
        super().__init__(load)
        self.responder = responder
        self.bill = bill
        self.spool = spool
        self.gcs = gcs or SandboxGcs()
        self._next = 0

    def create(self, project: str, location: str, body: dict[str, Any], scenario: Scenario, now: float) -> VertexJob:
        """A new job in JOB_STATE_PENDING; its input is read now (a job whose input cannot be read fails)."""
        uris = ((body.get("inputConfig") or {}).get("gcsSource") or {}).get("uris") or []
        self.gcs.require()
        self._next += 1
        job_id = str(int(now * 1000) % 10**12 * 1000 + self._next % 1000)
        requests, failure = spool_input(self.gcs, list(uris), self.spool / f"{job_id}.requests")
        error = None if failure is None else {"code": NOT_FOUND, "message": f"Failed to read the input: {failure}"}
        job = VertexJob(
            job_id,
            project,
            location,
            str(body.get("displayName") or ""),
            str(body["model"]),
            dict(body["inputConfig"]),
            dict(body["outputConfig"]),
            now,
            scenario,
            requests,
            requests.column("order"),
            error=error,
        )
        job.results = job.new_parts(self.spool)
        if not requests and error is None:
            job.error = {"code": INVALID_ARGUMENT, "message": "The input holds no requests."}
        self.add(job)
        self.book.hold("vertex", job.name, project, {job.model.rsplit("/", 1)[-1]: Load(0, len(requests), 1)}, now)
        return job

    def live(self, project: str, location: str) -> list[VertexJob]:
        """The jobs of a project and region that have not ended (what ``quota_concurrent_jobs`` counts)."""
        return [
            j
            for j in self.records.values()
            if (j.project, j.location) == (project, location) and j.state not in TERMINAL
        ]

    def not_found(self, job_id: str) -> Exception:
        return GoogleError(404, f"The BatchPredictionJob {job_id} does not exist.")

    def delete(self, job_id: str) -> None:
        job = self.get(job_id)
        if job.state not in TERMINAL:
            raise GoogleError(400, f"The BatchPredictionJob {job.name} is {job.state}; cancel it before deleting it.")
        self.drop_files(job)
        del self.records[job_id]

    def newest_first(self) -> list[VertexJob]:
        """By creation time, then id (a job's id grows with its creation)."""
        return sorted(self.records.values(), key=lambda j: (j.created_at, j.id), reverse=True)

    def cancel(self, job: VertexJob, now: float) -> None:
        """Start cancelling (processed requests are kept); 400 once the job has ended."""
        self.advance(job, now)
        if job.state in TERMINAL:
            raise GoogleError(
                400, f"The BatchPredictionJob {job.name} has already ended ({job.state}) and cannot be cancelled."
            )
        if job.state != "JOB_STATE_CANCELLING":
            job.state, job.cancel_at, job.updated_at = "JOB_STATE_CANCELLING", now, now

    def advance(self, job: VertexJob, now: float) -> bool:
        """Apply everything due by ``now``; True if anything changed."""
        before = (job.state, len(job.results))
        if job.state == "JOB_STATE_PENDING" and now >= job.processing_start:
            if job.error is not None:
                self._end(job, "JOB_STATE_FAILED", job.processing_start)
            else:
                job.state, job.started_at, job.updated_at = "JOB_STATE_RUNNING", job.processing_start, now
        if job.state == "JOB_STATE_RUNNING":
            expires = job.processing_start + EXPIRY_S
            natural_end = job.processing_end + job.duration("finalizing_s")
            if now >= expires and expires < natural_end:
                self._process_until(job, min(expires, job.processing_end))
                self._end(job, "JOB_STATE_EXPIRED", expires)
            elif now >= job.processing_end:
                self._process_until(job, job.processing_end)
                if job.scenario.name == "expire":
                    self._end(job, "JOB_STATE_EXPIRED", job.processing_end)
                elif now >= natural_end:
                    done = len(job.results) == len(job.requests)
                    self._end(job, "JOB_STATE_SUCCEEDED" if done else "JOB_STATE_PARTIALLY_SUCCEEDED", natural_end)
            else:
                self._process_until(job, now)
        elif job.state == "JOB_STATE_CANCELLING":
            due = job.cancel_due(job.cancel_at)
            if now >= due:
                self._end(job, "JOB_STATE_CANCELLED", due)
        if (job.state, len(job.results)) != before:
            job.updated_at = now
            return True
        return False

    def _quota(self, job: VertexJob) -> int:
        if job.scenario.name == "partial":
            return int(round(len(job.requests) * float(job.scenario.param("complete_share"))))
        return len(job.requests)

    def _process_until(self, job: VertexJob, at: float) -> None:
        due = min(lines_due(job, job.processing_start, at), self._quota(job))
        model = job.model.rsplit("/", 1)[-1]
        answers = job.answers
        while len(answers) < due:
            request = job.requests[job.order[len(answers)]]
            processed = rfc3339(job.processing_start + (at - job.processing_start) * (len(answers) + 1) / max(due, 1))
            if "_invalid" in request:
                status = {"code": 400, "message": request["_invalid"], "status": "INVALID_ARGUMENT"}
                answers.append(VertexAnswer(self._line(request, processed, status=status)))
                continue
            key = line_key(request)
            answer = self.responder.answer(key, model, request, job.scenario, job.id)
            line = self._line(request, processed, response=answer.response, status=answer.error)
            answers.append(VertexAnswer(line, key, answer.billed()) if answer.succeeded else VertexAnswer(line))
        answers.flush()  # on disk before the state is saved

    @staticmethod
    def _line(
        request: dict[str, Any],
        processed: str | None,
        *,
        response: dict[str, Any] | None = None,
        status: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A prediction line; a failed request's ``status`` is a text: the HTTP reason phrase, then the error as
        the HTTP envelope has it (HTTP code and status name; ``status`` given here is a google.rpc.Status)."""
        line: dict[str, Any] = {"status": "", "processed_time": processed, "request": request}
        if status is not None:
            code = int(status.get("code") or 13)
            http = code if code >= 100 else HTTP_OF_RPC.get(code, 500)
            error = {
                "code": http,
                "message": status.get("message"),
                "status": STATUS_NAMES.get(http, "UNKNOWN"),
                **({"details": status["details"]} if status.get("details") else {}),
            }
            line["status"] = f"{REASON_PHRASES.get(http, 'Error')}: {json.dumps({'error': error}, ensure_ascii=False)}"
        else:
            line["response"] = response
        return line

    def _end(self, job: VertexJob, state: str, at: float) -> None:
        """Reach a terminal state: write the processed lines to GCS, then bill the succeeded requests (once); the
        job keeps its counts only."""
        job.state, job.ended_at = state, at
        self.book.release("vertex", job.name, at)
        answers = job.answers
        if state != "JOB_STATE_FAILED" and len(answers):
            self._write_output(job, answers, at)
        job.compact()

    def _write_output(self, job: VertexJob, answers: VertexAnswers, at: float) -> None:
        """The predictions part streamed to ``predictions.jsonl`` in a new output directory; billed once written."""
        prefix = str((job.output_config.get("gcsDestination") or {}).get("outputUriPrefix") or "").rstrip("/")
        stamp = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        directory = f"{prefix}/prediction-model-{stamp}-{stable_hex(job.id, 'out', length=6)}"
        part = self.spool / f"{job.id}.predictions.jsonl"
        try:
            answers.take(PREDICTIONS, part)
            self.gcs.write_file(f"{directory}/predictions.jsonl", part)
        except (GcsUnavailable, GoogleError) as exc:
            job.state = "JOB_STATE_FAILED"
            job.error = {"code": INVALID_ARGUMENT, "message": f"Failed to write the predictions: {exc}"}
            return
        finally:
            part.unlink(missing_ok=True)
        job.output_dir = directory
        bill_rows(self.bill, answers.billing("vertex", job.model.rsplit("/", 1)[-1], at, batch_id=job.name))
