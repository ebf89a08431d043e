"""Bedrock model invocation jobs and their clock-driven lifecycle (advanced lazily, never by a background thread).

Submitted -> Validating -> Scheduled (a third of ``validating_s`` each) -> InProgress (records processed one by
one over ``in_progress_s``, in a shuffled order) -> Completed ``finalizing_s`` later. A stop moves a live job to
Stopping, and ``cancelling_s`` later to Stopped (the records processed so far are kept). At the job's timeout
(``timeoutDurationInHours``), or at the end of InProgress under the ``expire`` scenario, a job that processed some
records is PartiallyCompleted and one that processed none is Expired. ``fail_validation``, an input that could not
be read and more records than a job may hold (``max_records_per_job``) fail the job at the end of Validating. On
reaching any end the output is written to S3 (``<output>/<job id>/<input file>.out`` and ``manifest.json.out``) and
the successful records are billed, once.

A job's records are spooled when it is submitted (``<job>.requests``, a JSON line each, read back when run) and its
answers appended to a part per input file as they are produced (``bedrock/answers.py``); at the end each part is
streamed to its ``.out`` object and the job keeps its counts only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

from batch_pipeline.sandbox.anthropic.responder import AnthropicRunner
from batch_pipeline.sandbox.batches import lines_due, output_order
from batch_pipeline.sandbox.bedrock.answers import BedrockAnswers, part_name
from batch_pipeline.sandbox.bedrock.records import InputRecord, RecordResult, process
from batch_pipeline.sandbox.bedrock.s3 import SandboxS3, split_uri
from batch_pipeline.sandbox.quotas import DEFAULT_ACCOUNT, Load, LoadBook
from batch_pipeline.sandbox.scenarios import Scenario
from batch_pipeline.sandbox.spooled_lines import SpooledLines
from batch_pipeline.sandbox.spooled_parts import SpooledParts, bill_rows
from batch_pipeline.sandbox.spooled_record import SpooledRecord, SpooledStore
from batch_pipeline.sandbox.store import Bill

LIVE = ("Submitted", "Validating", "Scheduled", "InProgress")
ENDED = frozenset({"Completed", "PartiallyCompleted", "Failed", "Stopped", "Expired"})


def iso(value: float | None) -> str | None:
    """Clock seconds as ISO 8601 UTC (botocore parses it into a datetime)."""
    if value is None:
        return None
    return datetime.fromtimestamp(value, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class BedrockJob(SpooledRecord):
    """All the sandbox knows about one job. Times are clock seconds."""

    NESTED: ClassVar[dict[str, Any]] = {"records": InputRecord, "results": RecordResult}
    REQUESTS = "records"
    PARTS_TYPE = BedrockAnswers

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
    records: list[InputRecord] | SpooledLines  # a list until submitted (and in a state saved before the spool)
    order: Any  # the processing order: the spooled records' ``order`` column, or a list
    scenario: Scenario
    tags: dict[str, str] = field(default_factory=dict)
    status: str = "Submitted"
    message: str | None = None
    results: list[RecordResult] | BedrockAnswers = field(default_factory=list)
    last_modified: float = 0.0
    end_time: float | None = None
    stop_requested_at: float | None = None
    account: str = DEFAULT_ACCOUNT  # the access key that created it: whose job quota it counts against
    input_error: str | None = None  # why the input fails validation (the job's message once Failed)
    input_files: list[str] = field(default_factory=list)  # the input objects' keys, each with its .out
    totals: dict[str, int] | None = None  # once ended: its records, answers, succeeded and their tokens

    def __post_init__(self) -> None:
        if not self.input_files and isinstance(self.records, list):
            self.input_files = list(dict.fromkeys(record.file for record in self.records))

    def record_id(self) -> str:
        return self.job_id

    @property
    def ended(self) -> bool:
        return self.status in ENDED

    def record(self, index: int) -> InputRecord:
        """The ``index``-th input record (read back from the spool)."""
        record = self.records[index]
        return record if isinstance(record, InputRecord) else InputRecord(**record)

    def request_line(self, request: Any) -> dict[str, Any]:
        return dict(request.to_json())

    def new_parts(self, spool: Path) -> SpooledParts:
        return BedrockAnswers(spool, self.job_id, parts=[part_name(i) for i in range(len(self.input_files))])

    def keep_answer(self, parts: SpooledParts, answer: Any) -> None:
        assert isinstance(parts, BedrockAnswers)
        parts.append_to(self.input_files.index(self.record(answer.index).file), answer)

    def sums(self, answers: list[Any]) -> dict[str, int]:
        ok = [answer for answer in answers if answer.succeeded]
        input_tokens, output_tokens = sum(r.input_tokens for r in ok), sum(r.output_tokens for r in ok)
        return {"succeeded": len(ok), "input_tokens": input_tokens, "output_tokens": output_tokens}

    @property
    def created_at(self) -> float:  # Bedrock's name for it is the submit time
        return self.submit_time

    @property
    def requests(self) -> list[InputRecord] | SpooledLines:  # what ``lines_due`` counts
        return self.records

    @property
    def expiration(self) -> float:
        return self.submit_time + self.timeout_hours * 3600

    def counts(self) -> dict[str, int]:
        tally = self.tally()
        return {
            "totalRecordCount": tally["requests"],
            "processedRecordCount": tally["processed"],
            "successRecordCount": tally["succeeded"],
            "errorRecordCount": tally["processed"] - tally["succeeded"],
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


class BedrockJobs(SpooledStore[BedrockJob]):
    """The jobs of one sandbox (callers hold the state lock)."""

    record_type = BedrockJob

    def __init__(
        self, runner: AnthropicRunner, bill: Bill, s3: SandboxS3, spool: Path, load: LoadBook | None = None
    ) -> None:
        self.tokens: dict[str, str] = {}  # clientRequestToken -> job id: a retried create is the same job
        super().__init__(load)
        self.runner, self.bill, self.s3, self.spool = runner, bill, s3, spool

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
        """A new job: it counts against its account's job quota while live, unless a quota refused it. Its
        records are spooled, its answers will be."""
        records = job.records
        assert isinstance(records, list), "a job is submitted with the records read from its input"
        path = self.spool / f"{job.job_id}.requests"
        job.records = SpooledLines.write(path, (r.to_json() for r in records), order=job.order)
        job.order, job.results = job.records.column("order"), job.new_parts(self.spool)
        self.add(job)
        if refused:
            self.book.refuse("bedrock", job.job_id, job.account, [job.model_id], job.submit_time)
        else:
            self.book.hold(
                "bedrock", job.job_id, job.account, {job.model_id: Load(0, len(records), 1)}, job.submit_time
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
        answers = job.results
        assert isinstance(answers, BedrockAnswers), "a job's answers are spooled from its submit or load"
        while len(job.results) < due:
            index = job.order[len(job.results)]
            record = job.record(index)
            answer = process(self.runner, job.job_id, job.model_id, index, record, job.scenario)
            answers.append_to(job.input_files.index(record.file), answer)
        answers.flush()  # on disk before the state is saved

    def _close(self, job: BedrockJob, status: str, at: float) -> None:
        """The job ends: its output is written (unless it failed or expired), its succeeded records billed
        (once) and it keeps its counts only."""
        job.status, job.end_time, job.last_modified = status, at, at
        self.book.release("bedrock", job.job_id, at)
        answers = job.results
        assert isinstance(answers, BedrockAnswers), "a job's answers are spooled from its submit or load"
        if status not in ("Failed", "Expired"):
            self._write_output(job, answers)
        bill_rows(self.bill, answers.billing("bedrock", job.model_id, at))
        job.compact()

    def _write_output(self, job: BedrockJob, answers: BedrockAnswers) -> None:
        """One ``<input file name>.out`` per input file (lines in processing order) and ``manifest.json.out``."""
        bucket, prefix = job.output_prefix()
        for number, name in enumerate(job.input_files):
            key = prefix + name.rsplit("/", 1)[-1] + ".out"
            part = self.spool / f"{job.job_id}.{part_name(number)}.out"
            if answers.take(part_name(number), part):
                self.s3.write_file(bucket, key, part)
                part.unlink()
            else:
                self.s3.write(bucket, key, b"")
        tally = job.tally()
        manifest = {
            **job.counts(),
            "inputTokenCount": tally["input_tokens"],
            "outputTokenCount": tally["output_tokens"],
        }
        self.s3.write(bucket, prefix + "manifest.json.out", json.dumps(manifest).encode("utf-8"))


def new_job_order(records: list[InputRecord]) -> list[int]:
    """The processing (and output) order: shuffled, fixed by the record IDs."""
    return output_order("\n".join(r.record_id for r in records).encode("utf-8"), len(records))
