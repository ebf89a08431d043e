"""Bedrock model invocation jobs and their clock-driven lifecycle (advanced lazily, never by a background thread).

Submitted -> Validating -> Scheduled (a third of ``validating_s`` each) -> InProgress (records processed one by
one over ``in_progress_s``, in a shuffled order) -> Completed ``finalizing_s`` later. A stop moves a live job to
Stopping, and ``cancelling_s`` later to Stopped (the records processed so far are kept). At the job's timeout
(``timeoutDurationInHours``), or at the end of InProgress under the ``expire`` scenario, a job that processed some
records is PartiallyCompleted and one that processed none is Expired. ``fail_validation``, an input that could not
be read and more records than a job may hold (``max_records_per_job``) fail the job at the end of Validating. On
reaching any end the output is written to S3 (``<output>/<job id>/<input file>.out`` and ``manifest.json.out``) and
the successful records are billed, once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar

from batch_pipeline.sandbox.anthropic.responder import AnthropicRunner
from batch_pipeline.sandbox.batches import lines_due, output_order
from batch_pipeline.sandbox.bedrock.records import InputRecord, RecordResult, process
from batch_pipeline.sandbox.bedrock.s3 import SandboxS3, split_uri
from batch_pipeline.sandbox.quotas import DEFAULT_ACCOUNT, Load, LoadBook
from batch_pipeline.sandbox.scenarios import Scenario
from batch_pipeline.sandbox.store import Bill, ProcessedRecord, RecordStore

LIVE = ("Submitted", "Validating", "Scheduled", "InProgress")
ENDED = frozenset({"Completed", "PartiallyCompleted", "Failed", "Stopped", "Expired"})


def iso(value: float | None) -> str | None:
    """Clock seconds as ISO 8601 UTC (botocore parses it into a datetime)."""
    if value is None:
        return None
    return datetime.fromtimestamp(value, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class BedrockJob(ProcessedRecord):
    """All the sandbox knows about one job. Times are clock seconds."""

    NESTED: ClassVar[dict[str, Any]] = {"records": InputRecord, "results": RecordResult}

    job_id: str
    arn: str
    name: str
    model_id: str
    role_arn: str
    client_request_token: str
    input_uri: str
    output_uri: str
    timeout_hours: int
    submit_time: float
    records: list[InputRecord]
    order: list[int]
    scenario: Scenario
    tags: dict[str, str] = field(default_factory=dict)
    status: str = "Submitted"
    message: str | None = None
    results: list[RecordResult] = field(default_factory=list)
    last_modified: float = 0.0
    end_time: float | None = None
    stop_requested_at: float | None = None
    account: str = DEFAULT_ACCOUNT  # the access key that created it: whose job quota it counts against
    input_error: str | None = None  # why the input fails validation (the job's message once Failed)

    @property
    def created_at(self) -> float:  # Bedrock's name for it is the submit time
        return self.submit_time

    @property
    def requests(self) -> list[InputRecord]:  # what ``lines_due`` counts
        return self.records

    @property
    def expiration(self) -> float:
        return self.submit_time + self.timeout_hours * 3600

    def counts(self) -> dict[str, int]:
        ok = sum(1 for r in self.results if r.succeeded)
        return {
            "totalRecordCount": len(self.records),
            "processedRecordCount": len(self.results),
            "successRecordCount": ok,
            "errorRecordCount": len(self.results) - ok,
        }

    def summary(self) -> dict[str, Any]:
        """``ModelInvocationJobSummary`` (``GetModelInvocationJob`` returns the same fields)."""
        body: dict[str, Any] = {
            "jobArn": self.arn,
            "jobName": self.name,
            "modelId": self.model_id,
            "clientRequestToken": self.client_request_token,
            "roleArn": self.role_arn,
            "status": self.status,
            "submitTime": iso(self.submit_time),
            "lastModifiedTime": iso(self.last_modified or self.submit_time),
            "inputDataConfig": {"s3InputDataConfig": {"s3Uri": self.input_uri, "s3InputFormat": "JSONL"}},
            "outputDataConfig": {"s3OutputDataConfig": {"s3Uri": self.output_uri}},
            "timeoutDurationInHours": self.timeout_hours,
            "jobExpirationTime": iso(self.expiration),
            **self.counts(),
        }
        if self.message is not None:
            body["message"] = self.message
        if self.end_time is not None:
            body["endTime"] = iso(self.end_time)
        return body

    def output_prefix(self) -> tuple[str, str]:
        """(bucket, key prefix) of this job's output folder: ``<output s3Uri>/<job id>/``."""
        bucket, prefix = split_uri(self.output_uri)
        prefix = prefix.rstrip("/")
        return bucket, (prefix + "/" if prefix else "") + self.job_id + "/"


class BedrockJobs(RecordStore[BedrockJob]):
    """The jobs of one sandbox (callers hold the state lock)."""

    record_type = BedrockJob

    def __init__(self, runner: AnthropicRunner, bill: Bill, s3: SandboxS3, load: LoadBook | None = None) -> None:
        self.tokens: dict[str, str] = {}  # clientRequestToken -> job id: a retried create is the same job
        super().__init__(load)
        self.runner, self.bill, self.s3 = runner, bill, s3

    @staticmethod
    def key(record: BedrockJob) -> str:
        return record.job_id

    def clear(self) -> None:
        super().clear()
        self.tokens.clear()

    def add(self, job: BedrockJob) -> BedrockJob:
        self.tokens[job.client_request_token] = job.job_id
        return super().add(job)

    def submit(self, job: BedrockJob, refused: bool = False) -> None:
        """A new job: it counts against its account's job quota while live, unless a quota refused it."""
        self.add(job)
        if refused:
            self.book.refuse("bedrock", job.job_id, job.account, [job.model_id], job.submit_time)
        else:
            self.book.hold(
                "bedrock", job.job_id, job.account, {job.model_id: Load(0, len(job.records), 1)}, job.submit_time
            )

    def by_token(self, token: str) -> BedrockJob | None:
        job_id = self.tokens.get(token)
        return self.records.get(job_id) if job_id else None

    def newest_first(self) -> list[BedrockJob]:
        """By submit time (a stable sort: jobs submitted at one clock time keep their order)."""
        return sorted(self.records.values(), key=lambda j: j.submit_time, reverse=True)

    def stop(self, job: BedrockJob, now: float) -> bool:
        """Start stopping a live job; False when it has ended already (the caller answers 400)."""
        self.advance(job, now)
        if job.status in ENDED:
            return False
        if job.status != "Stopping":
            if job.status == "InProgress":
                self._process_until(job, now)
            job.status, job.stop_requested_at, job.last_modified = "Stopping", now, now
            self.book.release("bedrock", job.job_id, now)
        return True

    def advance(self, job: BedrockJob, now: float) -> bool:
        """Apply everything due by ``now``; True if anything changed."""
        before = (job.status, len(job.results))
        if job.status == "Stopping":
            due = job.cancel_due(job.stop_requested_at)
            if now >= due:
                self._close(job, "Stopped", due)
        elif job.status in LIVE:
            self._advance_live(job, now)
        return before != (job.status, len(job.results))

    def _advance_live(self, job: BedrockJob, now: float) -> None:
        third = job.duration("validating_s") / 3
        at = min(now, job.expiration)
        if job.input_error is None and job.scenario.name == "fail_validation":
            job.input_error = "Rejected by sandbox scenario fail_validation: the input did not pass validation."
        if job.input_error is not None and at >= job.submit_time + third:
            job.status, job.last_modified = "Validating", job.submit_time + third
            if at >= job.submit_time + 2 * third:
                job.message = job.input_error
                self._close(job, "Failed", job.submit_time + 2 * third)
            return
        never_starts = job.scenario.name == "expire" and float(job.scenario.param("complete_share")) == 0
        for status, start in (("Validating", job.submit_time + third), ("Scheduled", job.submit_time + 2 * third)):
            if at >= start and LIVE.index(job.status) < LIVE.index(status):
                job.status, job.last_modified = status, start
        if at >= job.processing_start and not never_starts:
            if job.status != "InProgress":
                job.status, job.last_modified = "InProgress", job.processing_start
            self._process_until(job, min(at, job.processing_end))
        natural_end = job.processing_end + job.duration("finalizing_s")
        if now >= job.expiration and job.expiration < natural_end:
            self._close(job, "PartiallyCompleted" if job.results else "Expired", job.expiration)
        elif job.scenario.name == "expire" and now >= job.processing_end:
            self._close(job, "PartiallyCompleted" if job.results else "Expired", job.processing_end)
        elif now >= natural_end:
            self._close(job, "Completed", natural_end)

    def _process_until(self, job: BedrockJob, at: float) -> None:
        due = lines_due(job, job.processing_start, at)
        while len(job.results) < due:
            index = job.order[len(job.results)]
            job.results.append(process(self.runner, job.job_id, job.model_id, index, job.records[index], job.scenario))

    def _close(self, job: BedrockJob, status: str, at: float) -> None:
        job.status, job.end_time, job.last_modified = status, at, at
        self.book.release("bedrock", job.job_id, at)
        if status not in ("Failed", "Expired"):
            self._write_output(job)
        self.bill(
            [
                r.ledger_row("bedrock", job.job_id, job.records[r.index].record_id, job.model_id, at)
                for r in job.results
                if r.succeeded
            ]
        )

    def _write_output(self, job: BedrockJob) -> None:
        """One ``<input file name>.out`` per input file (lines in processing order) and ``manifest.json.out``."""
        bucket, prefix = job.output_prefix()
        files: dict[str, list[str]] = {r.file: [] for r in job.records}
        for result in job.results:
            record = job.records[result.index]
            files[record.file].append(json.dumps(result.output, ensure_ascii=False, separators=(",", ":")))
        for name, lines in files.items():
            data = "".join(line + "\n" for line in lines).encode("utf-8")
            self.s3.write(bucket, prefix + name.rsplit("/", 1)[-1] + ".out", data)
        ok = [r for r in job.results if r.succeeded]
        manifest = {
            **job.counts(),
            "inputTokenCount": sum(r.input_tokens for r in ok),
            "outputTokenCount": sum(r.output_tokens for r in ok),
        }
        self.s3.write(bucket, prefix + "manifest.json.out", json.dumps(manifest).encode("utf-8"))


def new_job_order(records: list[InputRecord]) -> list[int]:
    """The processing (and output) order: shuffled, fixed by the record IDs."""
    return output_order("\n".join(r.record_id for r in records).encode("utf-8"), len(records))
