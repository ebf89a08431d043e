"""Handlers of Vertex AI's batch prediction endpoints, as ``google-genai`` calls them with ``vertexai=True``.

``genai.Client(vertexai=True, project=P, location=L, credentials=..., http_options={"base_url": URL})`` works
unchanged: ``/{v1beta1|v1}/projects/{project}/locations/{location}/batchPredictionJobs`` (POST create, GET list
with ``filter``/``pageSize``/``pageToken``), ``.../batchPredictionJobs/{id}`` (GET, DELETE) and
``.../{id}:cancel`` (POST). The SDK sends ``Authorization: Bearer TOKEN``: any token works but
``sandbox-bad`` (401 UNAUTHENTICATED); a project named ``denied-*`` is refused (403 PERMISSION_DENIED), as an
account without the ``aiplatform.batchPredictionJobs.*`` permissions is. The jobs themselves read and write the
GCS emulator (``vertex_gcs``). Errors are Google's envelope.
"""

from __future__ import annotations

import re
from typing import Any

from batch_pipeline.sandbox.google.errors import GoogleError, error_info
from batch_pipeline.sandbox.google.vertex_jobs import VertexJob
from batch_pipeline.sandbox.quotas import quota
from batch_pipeline.sandbox.routing import Request, Response, Router
from batch_pipeline.sandbox.scenarios import account_fault
from batch_pipeline.sandbox.state import SandboxState

VERSIONS = ("v1beta1", "v1")
_PATH = re.compile(r"^/(v1beta1|v1)/projects/[^/]+/locations/[^/]+/batchPredictionJobs(/|$)")
BAD_TOKEN = "sandbox-bad"
DENIED_PROJECT_PREFIX = "denied-"
MODEL_PREFIX = "publishers/google/models/"
_FILTER = re.compile(r'^\s*display_name\s*=\s*"((?:[^"\\]|\\.)*)"\s*$')
MAX_PAGE = 1000


def is_vertex_path(path: str) -> bool:
    """True for the Vertex batch prediction paths (answered in Google's envelope)."""
    return bool(_PATH.match(path))


def check_vertex_auth(request: Request) -> None:
    """401 without a bearer token or with ``sandbox-bad``; 403 for a ``denied-*`` project."""
    token = request.bearer()
    if not token or token == BAD_TOKEN:
        raise GoogleError(
            401,
            "Request had invalid authentication credentials. Expected OAuth 2 access token, "
            "login cookie or other valid authentication credential.",
            details=[error_info("ACCESS_TOKEN_TYPE_UNSUPPORTED")],
        )
    project = request.path.split("/")[3]
    if project.startswith(DENIED_PROJECT_PREFIX):
        raise GoogleError(
            403,
            f"Permission 'aiplatform.batchPredictionJobs.create' denied on resource "
            f"'//aiplatform.googleapis.com/projects/{project}/locations/"
            f"{request.path.split('/')[5]}' (or it may not exist).",
            details=[error_info("IAM_PERMISSION_DENIED", permission="aiplatform.batchPredictionJobs.create")],
        )


def _model(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise GoogleError(400, "model: Field required.")
    return model


def _config(body: dict[str, Any]) -> None:
    """inputConfig: jsonl from gcsSource.uris; outputConfig: jsonl to gcsDestination.outputUriPrefix."""
    source = body.get("inputConfig") if isinstance(body.get("inputConfig"), dict) else None
    if source is None or source.get("instancesFormat") != "jsonl":
        raise GoogleError(
            400, "inputConfig.instancesFormat must be jsonl (the sandbox serves Cloud Storage inputs only)."
        )
    uris = (source.get("gcsSource") or {}).get("uris")
    if not isinstance(uris, list) or not uris or not all(isinstance(u, str) and u.startswith("gs://") for u in uris):
        raise GoogleError(400, "inputConfig.gcsSource.uris must list gs:// objects.")
    dest = body.get("outputConfig") if isinstance(body.get("outputConfig"), dict) else None
    prefix = ((dest or {}).get("gcsDestination") or {}).get("outputUriPrefix")
    if (
        dest is None
        or dest.get("predictionsFormat") != "jsonl"
        or not isinstance(prefix, str)
        or not prefix.startswith("gs://")
    ):
        raise GoogleError(
            400, "outputConfig must be predictionsFormat jsonl with gcsDestination.outputUriPrefix gs://..."
        )


class VertexApi:
    """The batch prediction endpoints over a ``SandboxState`` (callers hold its lock)."""

    def __init__(self, state: SandboxState) -> None:
        self.state = state

    def register(self, router: Router) -> None:
        """Add the endpoints to ``router``; route names are the scenario endpoint names."""
        for version in VERSIONS:
            base = f"/{version}/projects/{{project}}/locations/{{location}}/batchPredictionJobs"
            router.add("POST", base, "vertex_create", self.create)
            router.add("GET", base, "vertex_list", self.list)
            router.add("POST", base + "/{job_id}:cancel", "vertex_cancel", self.cancel)
            router.add("GET", base + "/{job_id}", "vertex_get", self.get)
            router.add("DELETE", base + "/{job_id}", "vertex_delete", self.delete)
        router.add("GET", "/_sandbox/gcs", "admin_gcs", self.gcs_info)

    def gcs_info(self, request: Request) -> Response:
        """Where the emulator behind the sandbox's Vertex jobs is (started on first ask)."""
        return Response(payload={"gcs_endpoint_url": self.state.vertex.gcs.require()})

    def _job(self, request: Request) -> VertexJob:
        job = self.state.vertex.get(request.params["job_id"])
        if (job.project, job.location) != (request.params["project"], request.params["location"]):
            raise GoogleError(
                404,
                f"The BatchPredictionJob {request.params['job_id']} does not exist in "
                f"projects/{request.params['project']}/locations/{request.params['location']}.",
            )
        return job

    def create(self, request: Request) -> Response:
        body = request.json()
        model = _model(body)
        _config(body)
        fault = account_fault(self.state.scenario, [model.rsplit("/", 1)[-1]])
        if fault is not None:
            if fault.status == 404:
                raise GoogleError(
                    404,
                    f"Publisher Model `projects/{request.params['project']}/locations/"
                    f"{request.params['location']}/{model}` not found.",
                )
            raise GoogleError(
                403,
                "This API method requires billing to be enabled. Please enable billing on "
                f"project #{request.params['project']} (sandbox scenario no_credit).",
                details=[error_info("BILLING_DISABLED")],
            )
        self._check_concurrent(request.params["project"], request.params["location"], model)
        job = self.state.vertex.create(
            request.params["project"], request.params["location"], body, self.state.scenario, self.state.clock.now()
        )
        return Response(payload=job.to_api(), batch_id=job.name)

    def _check_concurrent(self, project: str, location: str, model: str) -> None:
        """429 RESOURCE_EXHAUSTED when the project already runs ``quota_concurrent_jobs`` jobs in the region."""
        cap = quota(self.state.scenario, "quota_concurrent_jobs")
        running = len(self.state.vertex.live(project, location)) if cap else 0
        if not cap or running < cap:
            return
        self.state.book.refuse("vertex", "", project, [model.rsplit("/", 1)[-1]], self.state.clock.now())
        raise GoogleError(
            429,
            f"Quota exceeded for aiplatform.googleapis.com/concurrent_batch_prediction_jobs: "
            f"project {project} has {running} batch prediction jobs not yet ended in {location}. "
            f"Limit: {cap} concurrent batch prediction jobs per project and region.",
            details=[
                error_info(
                    "RATE_LIMIT_EXCEEDED", quota_limit="concurrent_batch_prediction_jobs", quota_limit_value=str(cap)
                )
            ],
        )

    def get(self, request: Request) -> Response:
        job = self._job(request)
        return Response(payload=job.to_api(), batch_id=job.name)

    def cancel(self, request: Request) -> Response:
        job = self._job(request)
        self.state.vertex.cancel(job, self.state.clock.now())
        return Response(payload={}, batch_id=job.name)

    def delete(self, request: Request) -> Response:
        job = self._job(request)
        self.state.vertex.delete(job.id)
        return Response(payload={"name": f"{job.name}/operations/delete", "done": True}, batch_id=job.name)

    def list(self, request: Request) -> Response:
        """Newest first; ``filter`` supports ``display_name="..."``; ``pageToken`` is an offset."""
        wanted = None
        raw_filter = request.query.get("filter", "").strip()
        if raw_filter:
            match = _FILTER.match(raw_filter)
            if match is None:
                raise GoogleError(
                    400, f'Unsupported filter {raw_filter!r}: the sandbox filters on display_name="..." only.'
                )
            wanted = re.sub(r"\\(.)", r"\1", match.group(1))
        try:
            size = int(request.query.get("pageSize") or 100)
            start = int(request.query.get("pageToken") or 0)
        except ValueError:
            raise GoogleError(400, "pageSize and pageToken must be integers.") from None
        size = max(1, min(size, MAX_PAGE))
        jobs = [
            j
            for j in self.state.vertex.newest_first()
            if (j.project, j.location) == (request.params["project"], request.params["location"])
            and (wanted is None or j.display_name == wanted)
        ]
        page = jobs[start : start + size]
        payload: dict[str, Any] = {"batchPredictionJobs": [j.to_api() for j in page]}
        if start + size < len(jobs):
            payload["nextPageToken"] = str(start + size)
        return Response(payload=payload)
