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
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from batch_pipeline.sandbox.batches import lines_due, output_order
from batch_pipeline.sandbox.google.errors import RPC_CODES, STATUS_NAMES, GoogleError
from batch_pipeline.sandbox.google.responder import GeminiResponder
from batch_pipeline.sandbox.google.vertex_gcs import GcsUnavailable, SandboxGcs
from batch_pipeline.sandbox.ids import stable_hex
from batch_pipeline.sandbox.quotas import Load, LoadBook
from batch_pipeline.sandbox.scenarios import Scenario
from batch_pipeline.sandbox.store import Bill, ProcessedRecord, RecordStore, rfc3339

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


def parse_input(data: bytes) -> list[dict[str, Any]]:
    """The ``request`` of each input line (a line that is not ``{"request": {...}}`` keeps its text under
    ``_invalid``: it becomes a failed prediction line)."""
    requests = []
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            request = obj.get("request") if isinstance(obj, dict) else None
            if not isinstance(request, dict):
                raise ValueError("the line has no request object")
        except ValueError as exc:
            request = {"_invalid": f"line {number}: {exc}"}
        requests.append(request)
    return requests


@dataclass
class VertexJob(ProcessedRecord):
    """All the sandbox knows about one batch prediction job. Times are clock seconds."""

    id: str
    project: str
    location: str
    display_name: str
    model: str
    input_config: dict[str, Any]
    output_config: dict[str, Any]
    created_at: float
    scenario: Scenario
    requests: list[dict[str, Any]]
    order: list[int]
    state: str = "JOB_STATE_PENDING"
    lines: list[dict[str, Any]] = field(default_factory=list)
    billing: list[dict[str, Any]] = field(default_factory=list)
    started_at: float | None = None
    ended_at: float | None = None
    cancel_at: float | None = None
    updated_at: float | None = None
    error: dict[str, Any] | None = None
    output_dir: str | None = None

    @property
    def name(self) -> str:
        return f"projects/{self.project}/locations/{self.location}/batchPredictionJobs/{self.id}"

    def counts(self) -> dict[str, str]:
        """``completionStats`` (int64 fields, which REST JSON writes as strings)."""
        ok = sum(1 for line in self.lines if not line["status"])
        failed = len(self.lines) - ok
        incomplete = len(self.requests) - len(self.lines)
        return {"successfulCount": str(ok), "failedCount": str(failed), "incompleteCount": str(incomplete)}

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


class VertexJobs(RecordStore[VertexJob]):
    """The batch prediction jobs of one sandbox (callers hold the state lock)."""

    record_type = VertexJob

    def __init__(
        self, responder: GeminiResponder, bill: Bill, gcs: SandboxGcs | None = None, load: LoadBook | None = None
    ) -> None:
        super().__init__(load)
        self.responder = responder
        self.bill = bill
        self.gcs = gcs or SandboxGcs()
        self._next = 0

    def create(self, project: str, location: str, body: dict[str, Any], scenario: Scenario, now: float) -> VertexJob:
        """A new job in JOB_STATE_PENDING; its input is read now (a job whose input cannot be read fails)."""
        uris = ((body.get("inputConfig") or {}).get("gcsSource") or {}).get("uris") or []
        self.gcs.require()
        error = None
        requests: list[dict[str, Any]] = []
        try:
            for uri in uris:
                requests += parse_input(self.gcs.read(uri))
        except GcsUnavailable as exc:
            error = {"code": NOT_FOUND, "message": f"Failed to read the input: {exc}"}
        self._next += 1
        job_id = str(int(now * 1000) % 10**12 * 1000 + self._next % 1000)
        seed = "\n".join(json.dumps(r, sort_keys=True) for r in requests).encode("utf-8")
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
            output_order(seed, len(requests)),
            error=error,
        )
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
        before = (job.state, len(job.lines))
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
                    done = len(job.lines) == len(job.requests)
                    self._end(job, "JOB_STATE_SUCCEEDED" if done else "JOB_STATE_PARTIALLY_SUCCEEDED", natural_end)
            else:
                self._process_until(job, now)
        elif job.state == "JOB_STATE_CANCELLING":
            due = job.cancel_due(job.cancel_at)
            if now >= due:
                self._end(job, "JOB_STATE_CANCELLED", due)
        if (job.state, len(job.lines)) != before:
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
        while len(job.lines) < due:
            request = job.requests[job.order[len(job.lines)]]
            processed = rfc3339(job.processing_start + (at - job.processing_start) * (len(job.lines) + 1) / max(due, 1))
            if "_invalid" in request:
                status = {"code": 400, "message": request["_invalid"], "status": "INVALID_ARGUMENT"}
                job.lines.append(self._line(request, processed, status=status))
                continue
            key = line_key(request)
            answer = self.responder.answer(key, model, request, job.scenario, job.id)
            job.lines.append(self._line(request, processed, response=answer.response, status=answer.error))
            if answer.succeeded:
                unbilled = 0.0  # billed_at: set when the job ends and bills
                job.billing.append(answer.billed().ledger_row("vertex", job.name, key, model, unbilled))

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
        """Reach a terminal state: write the processed lines to GCS, then bill the succeeded requests."""
        job.state, job.ended_at = state, at
        self.book.release("vertex", job.name, at)
        if state == "JOB_STATE_FAILED" or not job.lines:
            return
        prefix = str((job.output_config.get("gcsDestination") or {}).get("outputUriPrefix") or "").rstrip("/")
        stamp = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        directory = f"{prefix}/prediction-model-{stamp}-{stable_hex(job.id, 'out', length=6)}"
        data = "".join(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n" for line in job.lines)
        try:
            self.gcs.write(f"{directory}/predictions.jsonl", data.encode("utf-8"))
        except (GcsUnavailable, GoogleError) as exc:
            job.state = "JOB_STATE_FAILED"
            job.error = {"code": INVALID_ARGUMENT, "message": f"Failed to write the predictions: {exc}"}
            return
        job.output_dir = directory
        self.bill([{**entry, "billed_at": at} for entry in job.billing])
        job.billing = []
