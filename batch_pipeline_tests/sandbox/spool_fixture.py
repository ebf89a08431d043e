"""A fixed Anthropic batch, Gemini file batch and Bedrock job run to their end on an in-process sandbox, and what
they give back byte for byte (results file, responses file, ``.out`` and manifest objects, ledger rows).

Ids are made deterministic (the ``secrets`` of ``ids`` and of the Bedrock API count instead of drawing; every HTTP
request counts one, its request id, so the calls must come in the same order) and the clock is frozen at a fixed time, so
two sandboxes that answer alike give identical bytes. ``data/results_before_provider_spool/`` was written by this
module run against the sandbox of 267acb1 (the answers of these three providers held in memory), from a worktree of
that commit: ``git worktree add BEFORE 267acb1 && cd BEFORE && python CHECKOUT/batch_pipeline_tests/sandbox/spool_fixture.py
OUT`` (CHECKOUT: this repository);
``test_provider_spool.py`` runs it again on this checkout and compares. ``data/state_provider_answers_in_memory/``
is ``--midway OUT`` run the same way: the three batches saved half-way, with their answers as lists.

A Vertex AI batch prediction job is fixed alike (``VertexBatch``, on a loopback GCS emulator the fixture starts):
``data/results_before_vertex_spool/`` is ``--vertex OUT`` and ``data/state_vertex_answers_in_memory/``
``--vertex-midway OUT``, both run on 9d3741f (whose Vertex jobs held their requests and prediction lines in memory,
as at 267acb1), in this checkout: ``python batch_pipeline_tests/sandbox/spool_fixture.py --vertex OUT``.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

FIXED_NOW = 4_102_444_800.0  # 2100-01-01: ahead of real time, so the sandbox's clock takes it
MIDWAY_COUNT = 20
COUNT = 120  # Bedrock takes at least 100 records a job
ANTHROPIC_MODEL = "claude-sonnet-4-5"
BEDROCK_MODEL = "anthropic.claude-3-5-haiku-20241022-v1:0"
LONG_SYSTEM = "You label support tickets with one label: billing, bug or other. " * 80  # > 1024 tokens: caching
SCHEMA = {"type": "object", "properties": {"label": {"type": "string", "enum": ["billing", "bug", "other"]}}}


class CountingSecrets:
    """Stands in for the ``secrets`` module in ``batch_pipeline.sandbox.ids``: ids from a counter."""

    def __init__(self) -> None:
        self.count = 0

    def token_hex(self, nbytes: int) -> str:
        self.count += 1
        return f"{self.count:0{2 * nbytes}x}"


def ticket(i: int) -> str:
    """The i-th prompt: poisoned, truncated or refused now and then, so errors and odd answers are in the files."""
    marker = {7: " [[sandbox:poison]]", 3: " [[sandbox:truncate]]", 5: " [[sandbox:refuse]]"}.get(i % 10, "")
    return f"ticket {i}: my invoice was charged twice and the app crashes{marker}"


def anthropic_requests() -> list[dict[str, Any]]:
    system = [{"type": "text", "text": LONG_SYSTEM, "cache_control": {"type": "ephemeral"}}]
    tool = {"name": "label", "input_schema": SCHEMA}
    out = []
    for i in range(COUNT):
        params: dict[str, Any] = {"model": ANTHROPIC_MODEL, "max_tokens": 64, "system": system}
        params["messages"] = [{"role": "user", "content": ticket(i)}]
        if i % 2:
            params.update(tools=[tool], tool_choice={"type": "tool", "name": "label"})
        out.append({"custom_id": f"a{i}", "params": params})
    return out


def gemini_input() -> bytes:
    config = {"responseMimeType": "application/json", "responseJsonSchema": SCHEMA, "maxOutputTokens": 32}
    lines = []
    for i in range(COUNT):
        request = {"contents": [{"role": "user", "parts": [{"text": ticket(i)}]}], "generationConfig": config}
        if i % 2:
            request["systemInstruction"] = {"parts": [{"text": LONG_SYSTEM}]}
        lines.append(json.dumps({"key": f"g{i}", "request": request}))
    return ("\n".join(lines) + "\n").encode()


def bedrock_input() -> bytes:
    lines = []
    for i in range(COUNT):
        body = {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 32}
        body["messages"] = [{"role": "user", "content": ticket(i)}]
        lines.append(json.dumps({"recordId": f"r{i:04d}", "modelInput": body if i != 11 else {"bad": 1}}))
    return ("\n".join(lines) + "\n").encode()


def _get(url: str, headers: dict[str, str]) -> bytes:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as response:
        return bytes(response.read())


def _until(check: Any, what: str) -> Any:
    for _ in range(500):
        if (found := check()) is not None:
            return found
        time.sleep(0.01)
    raise AssertionError(f"{what} never ended")


class Batches:
    """The three batches created on the sandbox at ``url`` through the providers' SDKs."""

    def __init__(self, url: str, count: int = COUNT) -> None:
        self.attach(url, aws=False)  # the calls in the order that made the fixture: its ids are counted
        self.anthropic_id = self.sdk.messages.batches.create(requests=anthropic_requests()[:count]).id  # type: ignore[arg-type]
        data = b"".join(gemini_input().splitlines(keepends=True)[:count])
        upload = self.genai.files.upload(file=io.BytesIO(data), config={"mime_type": "jsonl", "display_name": "in"})
        self.gemini_name = str(self.genai.batches.create(model="gemini-2.5-flash", src=str(upload.name)).name)
        self._aws()
        data = b"".join(bedrock_input().splitlines(keepends=True)[:count])
        self.s3.put_object(Bucket=self.bucket, Key="in/records.jsonl", Body=data)
        self.arn = self.bedrock.create_model_invocation_job(
            jobName="fixture",
            roleArn="arn:aws:iam::123456789012:role/r",
            modelId=BEDROCK_MODEL,
            inputDataConfig={"s3InputDataConfig": {"s3Uri": f"s3://{self.bucket}/in/records.jsonl"}},
            outputDataConfig={"s3OutputDataConfig": {"s3Uri": f"s3://{self.bucket}/out/"}},
        )["jobArn"]

    @classmethod
    def existing(cls, url: str, anthropic_id: str, gemini_name: str, arn: str) -> Batches:
        """The three batches a sandbox already has (a saved state's)."""
        batches = cls.__new__(cls)
        batches.anthropic_id, batches.gemini_name, batches.arn = anthropic_id, gemini_name, arn
        batches.attach(url)
        return batches

    def attach(self, url: str, aws: bool = True) -> None:
        """The SDKs' clients for the sandbox at ``url`` (again after a restart: a new port, a new S3)."""
        import anthropic
        from google import genai

        self.url = url
        self.sdk = anthropic.Anthropic(base_url=url, api_key="k", max_retries=0)
        self.genai = genai.Client(api_key="k", http_options={"base_url": url})
        if aws:
            self._aws()

    def _aws(self) -> None:
        import boto3

        url = self.url
        keys = {"region_name": "us-east-1", "aws_access_key_id": "AKID", "aws_secret_access_key": "x"}
        where = json.loads(_get(url + "/_sandbox/bedrock", {}))
        self.s3, self.bucket = boto3.client("s3", endpoint_url=where["s3_endpoint_url"], **keys), where["bucket"]
        self.bedrock = boto3.client("bedrock", endpoint_url=url, **keys)

    def outputs(self) -> dict[str, bytes]:
        """Once the clock has passed their ends: the results file, the responses file and the job's objects."""
        sdk, g, bedrock = self.sdk, self.genai, self.bedrock
        _until(lambda: sdk.messages.batches.retrieve(self.anthropic_id).results_url, "the Anthropic batch")
        out = {"anthropic.jsonl": anthropic_results(self.url, self.anthropic_id)}
        done = _until(lambda: j if (j := g.batches.get(name=self.gemini_name)).done else None, "the Gemini batch")
        out["gemini.jsonl"] = g.files.download(file=str(done.dest.file_name))
        ended = ("Completed", "PartiallyCompleted", "Failed", "Stopped", "Expired")
        arn = self.arn
        _until(lambda: arn if bedrock.get_model_invocation_job(jobIdentifier=arn)["status"] in ended else None, "job")
        prefix = f"out/{arn.rsplit('/', 1)[-1]}/"
        for name in ("records.jsonl.out", "manifest.json.out"):
            out["bedrock." + name] = self.s3.get_object(Bucket=self.bucket, Key=prefix + name)["Body"].read()
        return out


def anthropic_results(url: str, batch_id: str) -> bytes:
    """A batch's results file as sent."""
    headers = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
    return _get(f"{url}/v1/messages/batches/{batch_id}/results", headers)


def run_providers(url: str, admin: Any) -> dict[str, bytes]:
    """Run the three batches on the sandbox at ``url`` (clock frozen) to their end; their outputs by name."""
    batches = Batches(url)
    admin.clock(advance_s=3600)
    return {**batches.outputs(), "ledger.json": json.dumps(admin.ledger(), indent=1).encode()}


def deterministic() -> Any:
    """Make the sandbox's ids count (imported here: the checkout to run is whichever ``batch_pipeline`` imports)."""
    from batch_pipeline.sandbox import ids
    from batch_pipeline.sandbox.bedrock import api as bedrock_api

    ids.secrets = bedrock_api.secrets = CountingSecrets()  # type: ignore[assignment]


def fixed_clock(server: Any) -> None:
    """Freeze the clock, then jump it to ``FIXED_NOW`` (not a microsecond of real time in between)."""
    server.app.state.clock.set_frozen(True)
    server.app.state.clock.restore(FIXED_NOW)


def generate() -> dict[str, bytes]:
    """The outputs of the fixed batches on a fresh in-process sandbox (its ids made to count beforehand)."""
    from batch_pipeline.sandbox import SandboxAdmin, SandboxServer

    with SandboxServer(port=0) as server:
        fixed_clock(server)
        return run_providers(server.url, SandboxAdmin(server.url))


def save_midway(state_dir: Path) -> None:
    """A state directory saved half-way through the three batches (MIDWAY_COUNT requests each, in_progress over
    100 clock seconds), its clock a century ahead of real time so that a restart resumes it there."""
    from batch_pipeline.sandbox import SandboxAdmin, SandboxServer

    with SandboxServer(port=0, state_dir=str(state_dir)) as server:
        fixed_clock(server)
        admin = SandboxAdmin(server.url)
        admin.set_scenario("normal", in_progress_s=100, min_records=1)
        Batches(server.url, MIDWAY_COUNT)
        admin.clock(advance_s=0.05 + 50)


VERTEX_BUCKET = "vertex-fixture"
VERTEX_LABEL = "batch_pipeline_rid"  # the label a Vertex request carries its request ID in


def vertex_inputs(count: int = COUNT) -> list[bytes]:
    """Two input files of ``count`` lines in all: a request ID label (base32), a plain label or none (the ledger
    names it by a digest), a line that is no request (a failed prediction) and a blank line (skipped)."""
    config = {"responseMimeType": "application/json", "responseJsonSchema": SCHEMA, "maxOutputTokens": 32}
    files: list[list[str]] = [[], []]
    for i in range(count):
        request: dict[str, Any] = {"contents": [{"role": "user", "parts": [{"text": ticket(i)}]}]}
        request["generationConfig"] = config
        if i % 2:
            request["systemInstruction"] = {"parts": [{"text": LONG_SYSTEM}]}
        if i % 3 == 0:
            rid = base64.b32encode(hashlib.sha256(f"v{i}".encode()).digest()).decode().rstrip("=").lower()
            request["labels"] = {VERTEX_LABEL: rid}
        elif i % 3 == 1:
            request["labels"] = {VERTEX_LABEL: f"v{i}"}
        files[i * 2 // count].append(json.dumps({"request": request}) if i != 13 else json.dumps({"instance": i}))
    files[0].insert(5, "")
    return [("\n".join(lines) + "\n").encode() for lines in files]


@contextmanager
def gcs_emulator() -> Iterator[str]:
    """A loopback GCS emulator (in memory, in this process) the sandboxes started meanwhile read and write."""
    from gcp_storage_emulator.server import create_server

    server = create_server("127.0.0.1", 0, in_memory=True)
    server._api.daemon = True
    server.start()
    url = f"http://127.0.0.1:{server._api._httpd.server_address[1]}"
    before = os.environ.get("BATCH_PIPELINE_SANDBOX_GCS_URL")
    os.environ["BATCH_PIPELINE_SANDBOX_GCS_URL"] = url
    try:
        yield url
    finally:
        if before is None:
            os.environ.pop("BATCH_PIPELINE_SANDBOX_GCS_URL", None)
        else:
            os.environ["BATCH_PIPELINE_SANDBOX_GCS_URL"] = before
        server.stop()


class VertexBatch:
    """The fixed Vertex job, created on the sandbox at ``url`` through google-genai (its inputs put on GCS)."""

    def __init__(self, url: str, count: int = COUNT, name: str | None = None) -> None:
        from google.cloud import storage
        from google.genai import types

        self.attach(url)
        self.bucket = self.gcs.lookup_bucket(VERTEX_BUCKET) or self.gcs.create_bucket(VERTEX_BUCKET)
        if name is not None:
            self.name = name
            return
        uris = []
        for number, data in enumerate(vertex_inputs(count)):
            blob: storage.Blob = self.bucket.blob(f"in/part{number}.jsonl")
            blob.upload_from_string(data)
            uris.append(f"gs://{VERTEX_BUCKET}/in/part{number}.jsonl")
        source = types.BatchJobSource(format="jsonl", gcs_uri=uris)
        config = {"display_name": "fixture", "dest": f"gs://{VERTEX_BUCKET}/out"}
        self.name = str(self.genai.batches.create(model="gemini-2.5-flash", src=source, config=config).name)

    def attach(self, url: str) -> None:
        """The SDK's and the storage clients for the sandbox at ``url`` (again after a restart)."""
        from google import genai
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage
        from google.oauth2.credentials import Credentials

        self.url = url
        self.genai = genai.Client(
            vertexai=True,
            project="proj",
            location="us-central1",
            credentials=Credentials(token="t"),
            http_options={"base_url": url},
        )
        gcs_url = json.loads(_get(url + "/_sandbox/gcs", {}))["gcs_endpoint_url"]
        options = {"api_endpoint": gcs_url}
        self.gcs = storage.Client(project="p", credentials=AnonymousCredentials(), client_options=options)

    def outputs(self) -> dict[str, bytes]:
        """Once the clock has passed its end: the output objects (names and bytes) and the job's stats."""
        job = _until(lambda: j if (j := self.genai.batches.get(name=self.name)).end_time else None, "the job")
        directory = str(job.output_info.gcs_output_directory)
        bucket, _, prefix = directory[5:].partition("/")
        out = {"vertex.job.json": json.dumps([job.state.name, directory, job.completion_stats.model_dump()]).encode()}
        for blob in self.gcs.list_blobs(bucket, prefix=prefix + "/"):
            out["vertex." + blob.name.rsplit("/", 1)[-1]] = blob.download_as_bytes()
        return out


def generate_vertex() -> dict[str, bytes]:
    """The fixed Vertex job's outputs and ledger on a fresh in-process sandbox (clock frozen)."""
    from batch_pipeline.sandbox import SandboxAdmin, SandboxServer

    with gcs_emulator(), SandboxServer(port=0) as server:
        fixed_clock(server)
        admin = SandboxAdmin(server.url)
        job = VertexBatch(server.url)
        admin.clock(advance_s=3600)
        return {**job.outputs(), "vertex.ledger.json": json.dumps(admin.ledger(), indent=1).encode()}


def save_vertex_midway(state_dir: Path) -> None:
    """A state directory saved half-way through the Vertex job (MIDWAY_COUNT requests, over 100 clock seconds)."""
    from batch_pipeline.sandbox import SandboxAdmin, SandboxServer

    with gcs_emulator(), SandboxServer(port=0, state_dir=str(state_dir)) as server:
        fixed_clock(server)
        admin = SandboxAdmin(server.url)
        admin.set_scenario("normal", in_progress_s=100, min_records=1)
        VertexBatch(server.url, MIDWAY_COUNT)
        admin.clock(advance_s=0.05 + 50)


if __name__ == "__main__":
    sys.path[0] = os.getcwd()  # the checkout to run is the working directory (not this tests directory)
    target = Path(sys.argv[-1])
    deterministic()
    if sys.argv[1] == "--midway":
        save_midway(target)
    elif sys.argv[1] == "--vertex-midway":
        save_vertex_midway(target)
    elif sys.argv[1] == "--vertex":
        target.mkdir(parents=True, exist_ok=True)
        for name, data in generate_vertex().items():
            (target / name).write_bytes(data)
    else:
        target.mkdir(parents=True, exist_ok=True)
        for name, data in generate().items():
            (target / name).write_bytes(data)
    import batch_pipeline.sandbox

    print("written from", batch_pipeline.sandbox.__file__)
