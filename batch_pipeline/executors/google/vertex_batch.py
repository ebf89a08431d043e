"""Vertex AI batch prediction for Gemini (real ``google-genai`` SDK, ``vertexai=True``; GCS through
``google-cloud-storage``): write the input JSONL to GCS, create a batch prediction job, poll it, read the
predictions back from GCS, cancel, find.

- Input: ``gs://BUCKET/PREFIX/JOB/SHARD/ATTEMPT-NONCE/input.jsonl`` (``gcs.AttemptObjects``), one
  ``{"request": GenerateContentRequest}`` per item. Vertex lines carry no key: the request ID rides in the
  request's ``labels`` (see ``vertex_lines``), with a fallback on the echoed ``contents``.
- Output: every ``predictions*.jsonl`` under the job's ``outputInfo.gcsOutputDirectory``. The lines read are
  checked against ``completionStats`` (fewer lines than the job reports is a TransientError: fetched again).
- States: every ``JOB_STATE_*`` is mapped (``STATE_MAP``); an unknown one is an error.
  ``JOB_STATE_PARTIALLY_SUCCEEDED`` is an ended batch whose results are ingested: the requests without a line
  stay pending and go in the shard's next attempt. ``PAUSED`` counts as running (it resumes by itself or is
  rescued); ``FAILED`` ingests nothing and stops the job with the job's error.
- Re-attach: the job's ``displayName`` is the attempt key; ``find`` lists jobs with a ``display_name`` filter.
  ``submit`` sends the create without retries: after a 5xx or a lost connection it asks ``find`` first.
- Credentials only from the environment: application-default credentials, project and location from the
  settings or ``GOOGLE_CLOUD_PROJECT`` / ``GOOGLE_CLOUD_LOCATION``. With ``sandbox: true`` the SDK's base URL is
  ``$BATCH_PIPELINE_SANDBOX_URL`` and the credentials a fixed fake token (``AnonymousCredentials`` cannot be
  used: the SDK refreshes any credentials without a token, and anonymous ones refuse to refresh), and GCS is the
  loopback emulator at ``$STORAGE_EMULATOR_HOST``.
"""

import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence

import google.genai as genai
import pyarrow as pa
from google.genai import types as gtypes
from google.oauth2.credentials import Credentials

from batch_pipeline.core.error_table import Family
from batch_pipeline.core.errors import ConfigError, TransientError
from batch_pipeline.core.ledger.capacity import Dimension
from batch_pipeline.core.ledger.executor import BatchHandle, BatchStatus, ShardWork
from batch_pipeline.executors.endpoint import SANDBOX_URL_ENV, resolve_endpoint
from batch_pipeline.executors.google.gcs import AttemptObjects, Gcs, parse_gs_uri, sandbox_emulator_url
from batch_pipeline.executors.google.genai_executor import STATE_MAP, GenaiBatchExecutor, shared_tls_args
from batch_pipeline.executors.google.sdk_errors import retry_delay_s
from batch_pipeline.executors.google.settings import DEFAULT_LOCATION, SANDBOX_BUCKET, VertexBatchSettings
from batch_pipeline.executors.google.vertex_lines import content_index, parse_predictions_block, request_lines
from batch_pipeline.executors.jsonl_blocks import parse_stream

log = logging.getLogger(__name__)

S = gtypes.JobState
__all__ = ["STATE_MAP", "VertexBatchExecutor", "VertexBatchSettings", "retry_delay_s"]
SANDBOX_TOKEN = "sandbox-vertex-token"
SANDBOX_PROJECT = "sandbox-project"


class VertexBatchExecutor(GenaiBatchExecutor):
    name = "vertex_batch"
    family = Family.VERTEX
    provider = "Vertex AI"
    batch_noun = "batch job"
    quota_dimensions = (Dimension.JOBS,)
    quota_per_model = False  # concurrent jobs per project and region
    window_hours = None  # outputs land in our own bucket; no provider window is stated here
    pricing = "batch"
    max_requests_per_batch = 200_000
    max_bytes_per_batch = 2**30
    settings_model = VertexBatchSettings

    def __init__(self, settings: VertexBatchSettings):
        super().__init__(settings)
        self.project = (
            settings.project
            or os.environ.get("GOOGLE_CLOUD_PROJECT")
            or (SANDBOX_PROJECT if settings.sandbox else None)
        )
        if not self.project:
            raise ConfigError("backend vertex_batch needs a project: settings.project or $GOOGLE_CLOUD_PROJECT")
        self.location = settings.location or os.environ.get("GOOGLE_CLOUD_LOCATION") or DEFAULT_LOCATION
        self.bucket = settings.bucket or SANDBOX_BUCKET
        base_url, _ = resolve_endpoint(
            self.name, sandbox=settings.sandbox, base_url=settings.base_url, api_key_env=None, key_required=False
        )
        # The sandbox is plain HTTP on loopback, where no client certificate applies: the process's TLS context
        # spares the SDK building three of its own (~66 ms an executor, and one is made per step). Against Vertex
        # itself the SDK builds them, with Google's default client certificate when one is configured (mTLS).
        tls = shared_tls_args() if settings.sandbox else {}
        options = gtypes.HttpOptions(base_url=base_url, timeout=int(settings.timeout_s * 1000), **tls)
        credentials = Credentials(token=SANDBOX_TOKEN) if settings.sandbox else None  # else ADC, loaded by the SDK
        self._secret = SANDBOX_TOKEN if settings.sandbox else None
        try:
            self.client = genai.Client(
                vertexai=True,
                project=self.project,
                location=self.location,
                credentials=credentials,
                http_options=options,
            )
        except ValueError as exc:
            raise ConfigError(f"backend vertex_batch: {exc}") from None
        emulator = sandbox_emulator_url(os.environ[SANDBOX_URL_ENV], settings.timeout_s) if settings.sandbox else None
        self.gcs = Gcs(self.project, emulator_url=emulator, timeout_s=settings.timeout_s)
        if settings.sandbox:
            self.gcs.ensure_bucket(self.bucket)

    # -- submit ---------------------------------------------------------------------------------------------
    def submit(self, work: ShardWork) -> BatchHandle:
        if work.items.num_rows > self.max_requests_per_batch:
            raise ConfigError(
                f"shard {work.shard_id} has {work.items.num_rows} requests; Vertex allows "
                f"{self.max_requests_per_batch} per batch job (lower shards.max_requests)"
            )
        data = request_lines(work)
        if len(data) > self.max_bytes_per_batch:
            raise ConfigError(
                f"shard {work.shard_id} input is {len(data)} bytes; Vertex reads at most "
                f"{self.max_bytes_per_batch} per input file (lower shards.max_bytes)"
            )
        objects = AttemptObjects.for_key(self.bucket, self.settings.prefix, work.key)
        self.gcs.upload(objects.bucket, objects.input_name, data)
        config = gtypes.CreateBatchJobConfig(display_name=work.key, dest=objects.output_uri)
        return self._create_once(
            work.key,
            lambda: self.client.batches.create(model=work.plan.model, src=objects.input_uri, config=config),
            Dimension.JOBS,  # RESOURCE_EXHAUSTED: the project's concurrent jobs are all running
            objects.input_uri,
        )

    # -- poll / fetch / cancel --------------------------------------------------------------------------------
    def _status(self, job: gtypes.BatchJob) -> BatchStatus:
        state = self._state(job)
        stats = job.completion_stats
        ok, failed, incomplete = (
            (stats.successful_count or 0, stats.failed_count or 0, stats.incomplete_count or 0)
            if stats is not None
            else (0, 0, 0)
        )
        errors = [f"{job.error.code}: {job.error.message}"] if job.error is not None and job.error.message else []
        provider_status = job.state.value if isinstance(job.state, S) else str(job.state)
        return BatchStatus(state, provider_status, ok + failed + incomplete, ok, failed + incomplete, errors)

    def _output_dir(self, job: gtypes.BatchJob) -> tuple[str, str] | None:
        """(bucket, prefix) of the job's predictions; None when the job wrote none."""
        directory = job.output_info.gcs_output_directory if job.output_info is not None else None
        if not directory:
            return None
        bucket, prefix = parse_gs_uri(directory)
        return bucket, prefix.rstrip("/") + "/"

    def fetch(self, handle: BatchHandle) -> Iterator[pa.Table]:
        job = self._get(handle)
        where = self._output_dir(job)
        if where is None:
            log.warning("Vertex batch job %s (%s) has no output directory: no results", handle.batch_id, job.state)
            return
        bucket, prefix = where
        lookup = self._lookup(handle)
        lines = 0
        for name in self.gcs.list_names(bucket, prefix):
            for table in parse_stream(
                lambda block: parse_predictions_block(block, lookup), self.gcs.stream(bucket, name), self.parse_workers
            ):
                lines += table.num_rows
                yield table
        stats = job.completion_stats
        reported = (stats.successful_count or 0) + (stats.failed_count or 0) if stats is not None else 0
        if lines < reported:
            raise TransientError(
                f"Vertex batch job {handle.batch_id}: {lines} prediction lines under "
                f"gs://{bucket}/{prefix}, but completionStats reports {reported} processed"
            )
        if lines > reported and stats is not None:
            log.warning(
                "Vertex batch job %s: %d prediction lines, completionStats reports %d", handle.batch_id, lines, reported
            )

    def _lookup(self, handle: BatchHandle) -> Callable[[str], str | None]:
        """contents digest -> request ID from the attempt's input object, read once and only if a line needs it."""
        index: dict[str, str] | None = None
        lock = threading.Lock()

        def lookup(digest: str) -> str | None:
            nonlocal index
            with lock:
                if index is None:
                    index = {}
                    if handle.input_file_id:
                        bucket, name = parse_gs_uri(handle.input_file_id)
                        index = content_index(self.gcs.read(bucket, name))
            return index.get(digest)

        return lookup

    def discard(self, handle: BatchHandle) -> list[str]:
        """Delete our own GCS objects of the attempt once its results are stored: the input we uploaded and
        everything under the job's output prefix (``AttemptObjects``: ``.../ATTEMPT-NONCE/output/``, this attempt's
        alone). The job record holds no data and stays. An object already gone counts as deleted."""
        job = self._get(handle)
        src = job.src.gcs_uri if job.src is not None and job.src.gcs_uri else []
        inputs = [handle.input_file_id] if handle.input_file_id else list(src)
        gone = []
        for uri in inputs:
            self.gcs.delete(*parse_gs_uri(uri))
            gone.append(uri)
        dest = job.dest.gcs_uri if job.dest is not None else None
        bucket, prefix = parse_gs_uri(dest) if dest else (self.bucket, "")
        prefix = prefix.strip("/")
        if not prefix.endswith("/output"):  # not a prefix we made: never delete under it
            log.warning(
                "Vertex batch job %s: output %s is not an attempt's own prefix; left as it is", handle.batch_id, dest
            )
            return gone
        for name in self.gcs.list_names(bucket, prefix + "/", pattern="*"):
            self.gcs.delete(bucket, name)
            gone.append(f"gs://{bucket}/{name}")
        return gone

    def find(
        self, key: str, request_ids: Sequence[str] | None = None, not_before: str | None = None
    ) -> BatchHandle | None:
        """The job whose display name is the attempt key (the newest, should there be several)."""
        config = gtypes.ListBatchJobsConfig(page_size=100, filter=f'display_name="{key}"')
        matches = list(self._named(key, config))
        if not matches:
            return None
        job = max(matches, key=lambda j: (j.create_time is not None, j.create_time))
        src = job.src.gcs_uri if job.src is not None and job.src.gcs_uri else []
        return BatchHandle(self.name, str(job.name), key, src[0] if src else None)
