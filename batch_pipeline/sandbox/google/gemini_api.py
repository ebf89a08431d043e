"""Handlers of the Gemini Developer API's Files and Batches endpoints, as ``google-genai`` calls them.

``genai.Client(api_key=..., http_options={"base_url": URL})`` works unchanged: the SDK puts its key in the
``x-goog-api-key`` header, which is how these requests are told apart from OpenAI's on the same ``/v1/files``
and ``/v1/batches`` paths (``is_gemini_request``). Every version prefix the SDK may use is served (``v1``, the
3.x default; ``v1beta`` with ``GOOGLE_GENAI_API_VERSION=beta``; ``v1alpha``). Errors are Google's envelope.
Embeddings batches (``models/M:asyncBatchEmbedContent``, ``batches.create_embeddings``) are created here too and
then read, listed, cancelled and deleted through the same batch routes.
"""

from __future__ import annotations

from typing import Any

from batch_pipeline.sandbox.google.errors import GoogleError, error_info
from batch_pipeline.sandbox.google.gemini_batches import MAX_INLINE_BYTES, BatchAsk
from batch_pipeline.sandbox.google.gemini_files import GeminiFile, gemini_id
from batch_pipeline.sandbox.quotas import account_of, clock_scale
from batch_pipeline.sandbox.routing import Request, Response, Router
from batch_pipeline.sandbox.scenarios import UNKNOWN_MODEL_PREFIX
from batch_pipeline.sandbox.spool import FileBody
from batch_pipeline.sandbox.state import SandboxState

KEY_HEADER = "x-goog-api-key"
BAD_KEY = "sk-sandbox-bad"
VERSIONS = ("v1", "v1beta", "v1alpha")
GEMINI_PREFIXES = ("/upload/", "/download/", "/v1beta/", "/v1alpha/")
MAX_FILE_BYTES = 2 * 2**30
CHUNK_GRANULARITY = 8 * 2**20
JSONL = "application/jsonl"


def is_gemini_request(request: Request) -> bool:
    """A request for the Gemini API: it carries ``x-goog-api-key`` or uses a path only Gemini has."""
    return KEY_HEADER in request.headers or request.path.startswith(GEMINI_PREFIXES)


def check_gemini_auth(request: Request) -> None:
    """403 without a key, 400 ``API_KEY_INVALID`` for ``sk-sandbox-bad`` (what Google answers); an upload
    session's own URL needs no key (its ``upload_id`` is the credential)."""
    if request.path.startswith("/upload/") and "upload_id" in request.query:
        return
    key = request.headers.get(KEY_HEADER, "").strip() or request.query.get("key", "").strip()
    if not key:
        raise GoogleError(
            403,
            "Method doesn't allow unregistered callers (callers without established identity). "
            "Please use API Key or other form of API consumer identity to call this API.",
        )
    if key == BAD_KEY:
        raise GoogleError(
            400,
            "API key not valid. Please pass a valid API key.",
            details=[error_info("API_KEY_INVALID", service="generativelanguage.googleapis.com")],
        )


def _version(request: Request) -> str:
    version = request.params.get("version", "")
    if version not in VERSIONS:
        raise GoogleError(404, f"Unknown API version {version!r}; served: {', '.join(VERSIONS)}.")
    return version


def _host(request: Request) -> str:
    return request.headers.get("host") or "127.0.0.1"


def _page(request: Request, default: int, high: int) -> tuple[int, int]:
    """(page size, start offset) from ``pageSize`` and ``pageToken`` (an offset here)."""
    try:
        size = int(request.query.get("pageSize") or default)
        start = int(request.query.get("pageToken") or 0)
    except ValueError:
        raise GoogleError(400, "pageSize and pageToken must be integers.") from None
    if size < 1:
        raise GoogleError(400, "pageSize must be positive.")
    return min(size, high), max(start, 0)


def account_fault(state: SandboxState, model: str) -> GoogleError | None:
    """An unknown model (``unknown-*`` or the ``unknown_model`` scenario) or an account without billing."""
    name = model.removeprefix("models/")
    if name.startswith(UNKNOWN_MODEL_PREFIX) or state.scenario.name == "unknown_model":
        return GoogleError(
            404,
            f"models/{name} is not found for API version v1, or is not supported for "
            "batchGenerateContent. Call ListModels to see the list of available models.",
        )
    if state.scenario.name == "no_credit":
        return GoogleError(
            403,
            "This API method requires billing to be enabled. Enable billing for the project, "
            "then retry (sandbox scenario no_credit).",
            details=[error_info("BILLING_DISABLED", service="generativelanguage.googleapis.com")],
        )
    return None


class GeminiApi:
    """The Files and Batches endpoints over a ``SandboxState`` (callers hold its lock)."""

    def __init__(self, state: SandboxState) -> None:
        self.state = state
        self.gemini = state.gemini
        self.files = state.gemini_files

    def register(self, router: Router) -> None:
        """Routes (names are the scenario endpoint names); ``:download`` and ``:cancel`` before ``{id}``."""
        router.add("POST", "/upload/{version}/files", "gemini_upload", self.upload)
        router.add("GET", "/download/{version}/files/{file_id}:download", "gemini_download", self.download)
        router.add("GET", "/{version}/files/{file_id}:download", "gemini_download", self.download)
        router.add("GET", "/{version}/files", "gemini_list_files", self.list_files)
        router.add("GET", "/{version}/files/{file_id}", "gemini_get_file", self.get_file)
        router.add("DELETE", "/{version}/files/{file_id}", "gemini_delete_file", self.delete_file)
        router.add("POST", "/{version}/models/{model}:batchGenerateContent", "gemini_create", self.create)
        router.add("POST", "/{version}/models/{model}:asyncBatchEmbedContent", "gemini_create", self.create_embeddings)
        router.add("POST", "/{version}/batches/{batch_id}:cancel", "gemini_cancel", self.cancel)
        router.add("GET", "/{version}/batches", "gemini_list", self.list)
        router.add("GET", "/{version}/batches/{batch_id}", "gemini_get", self.get)
        router.add("DELETE", "/{version}/batches/{batch_id}", "gemini_delete", self.delete)

    # files: resumable upload ----------------------------------------------------------------------------------
    def upload(self, request: Request) -> Response:
        version = _version(request)
        command = {c.strip() for c in request.headers.get("x-goog-upload-command", "").lower().split(",")}
        if "start" in command:
            return self._start(request, version)
        session_id = request.query.get("upload_id")
        session = self.files.uploads.get(session_id or "")
        if session is None:
            raise GoogleError(404, "Unknown or finished upload session.", headers={"x-goog-upload-status": "final"})
        if not command & {"upload", "finalize"}:
            raise GoogleError(
                400,
                "X-Goog-Upload-Command must be start, upload or finalize.",
                headers={"x-goog-upload-status": "active"},
            )
        offset = request.headers.get("x-goog-upload-offset")
        if offset is None or not offset.isdigit() or int(offset) != session.received:
            raise GoogleError(
                400,
                f"X-Goog-Upload-Offset is {offset!r}; {session.received} bytes were received.",
                headers={"x-goog-upload-status": "active"},
            )
        stored = session.file
        if session.received + len(request.body) > stored.size:
            self.files.end_upload(session_id or "").path.unlink(missing_ok=True)
            raise GoogleError(
                400,
                f"Received {session.received + len(request.body)} bytes; the upload declared {stored.size}.",
                headers={"x-goog-upload-status": "final"},
            )
        session.append(request.body)
        if "finalize" not in command:
            return Response(
                payload=b"",
                content_type="text/plain",
                headers={"x-goog-upload-status": "active", "x-goog-upload-size-received": str(session.received)},
            )
        self.files.end_upload(session_id or "")
        if session.received != stored.size:
            session.path.unlink(missing_ok=True)
            raise GoogleError(
                400,
                f"Finalized after {session.received} bytes; the upload declared {stored.size}.",
                headers={"x-goog-upload-status": "final"},
            )
        stored.created_at = self.state.clock.now()
        self.files.add_file(stored, session.path)
        return Response(
            payload={"file": stored.to_api(_host(request), version)}, headers={"x-goog-upload-status": "final"}
        )

    def _start(self, request: Request, version: str) -> Response:
        if request.headers.get("x-goog-upload-protocol", "").lower() != "resumable":
            raise GoogleError(400, "Only X-Goog-Upload-Protocol: resumable is served.")
        size_header = request.headers.get("x-goog-upload-header-content-length", "")
        if not size_header.isdigit():
            raise GoogleError(400, "X-Goog-Upload-Header-Content-Length is required.")
        size = int(size_header)
        if size > MAX_FILE_BYTES:
            raise GoogleError(400, f"The file is {size} bytes; at most {MAX_FILE_BYTES} are accepted.")
        meta = request.json().get("file") or {}
        if not isinstance(meta, dict):
            raise GoogleError(400, "`file` must be an object.")
        # proto JSON: lowerCamel or the original snake_case names (the SDK sends its File model's snake_case)
        mime = (
            request.headers.get("x-goog-upload-header-content-type")
            or meta.get("mimeType")
            or meta.get("mime_type")
            or JSONL
        )
        name = str(meta.get("name") or "").removeprefix("files/") or gemini_id()
        if name in self.files:
            raise GoogleError(409, f"File files/{name} already exists.")
        display = meta.get("displayName", meta.get("display_name"))
        display = display if isinstance(display, str) else None
        session_id = gemini_id() + gemini_id()
        self.files.open_upload(session_id, GeminiFile(name, display, str(mime), 0.0, size))
        url = f"http://{_host(request)}/upload/{version}/files?upload_id={session_id}&upload_protocol=resumable"
        return Response(
            payload=b"",
            content_type="text/plain",
            headers={
                "x-goog-upload-url": url,
                "x-goog-upload-status": "active",
                "x-goog-upload-chunk-granularity": str(CHUNK_GRANULARITY),
            },
        )

    # files ----------------------------------------------------------------------------------------------------
    def get_file(self, request: Request) -> Response:
        version = _version(request)
        return Response(payload=self.files.get(request.params["file_id"]).to_api(_host(request), version))

    def list_files(self, request: Request) -> Response:
        version = _version(request)
        size, start = _page(request, 10, 100)
        files = self.files.newest_first()
        payload: dict[str, Any] = {"files": [f.to_api(_host(request), version) for f in files[start : start + size]]}
        if start + size < len(files):
            payload["nextPageToken"] = str(start + size)
        return Response(payload=payload)

    def delete_file(self, request: Request) -> Response:
        _version(request)
        self.files.delete(request.params["file_id"])
        return Response(payload={})

    def download(self, request: Request) -> Response:
        _version(request)
        if request.query.get("alt") != "media":
            raise GoogleError(400, "Downloads need alt=media.")
        stored = self.files.get(request.params["file_id"])
        if stored.source != "GENERATED":
            raise GoogleError(400, f"File files/{stored.id} was uploaded; only generated files can be downloaded.")
        return Response(payload=FileBody.open(stored.path, stored.size), content_type=JSONL)

    # batches --------------------------------------------------------------------------------------------------
    def create(self, request: Request) -> Response:
        """``batchGenerateContent`` of an uploaded file (``inputConfig.fileName``) or of inline requests
        (``inputConfig.requests.requests``, what ``batches.create(src=[...])`` sends); a body over the API's
        20 MiB payload limit is its 400 INVALID_ARGUMENT."""
        return self._create(request, embed=False)

    def create_embeddings(self, request: Request) -> Response:
        """``asyncBatchEmbedContent``: as ``create``, of ``EmbedContentRequest`` s (the SDK's
        ``create_embeddings`` names the file ``inputConfig.file_name``, the proto name, which is read too)."""
        return self._create(request, embed=True)

    def _create(self, request: Request, embed: bool) -> Response:
        _version(request)
        if len(request.body) > MAX_INLINE_BYTES:
            raise GoogleError(400, f"Request payload size exceeds the limit: {MAX_INLINE_BYTES} bytes.")
        model = "models/" + request.params["model"].removeprefix("models/")
        batch = request.json().get("batch")
        if not isinstance(batch, dict):
            raise GoogleError(400, "`batch` is required.")
        config = batch.get("inputConfig") if isinstance(batch.get("inputConfig"), dict) else {}
        file_name = config.get("fileName", config.get("file_name"))
        inline = "requests" in config
        if inline and file_name is not None:
            raise GoogleError(400, "batch.inputConfig takes one source: fileName or requests, not both.")
        if not inline and (not isinstance(file_name, str) or not file_name.startswith("files/")):
            raise GoogleError(400, "batch.inputConfig needs fileName (an uploaded file, files/ID) or requests.")
        display = batch.get("displayName") if isinstance(batch.get("displayName"), str) else None
        if display is not None and len(display) > 512:
            raise GoogleError(400, "batch.displayName is longer than 512 characters.")
        fault = account_fault(self.state, model)
        if fault is not None:
            raise fault
        ask = BatchAsk(
            model,
            display,
            self.state.scenario,
            self.state.clock.now,
            account_of(request, "gemini"),
            clock_scale(self.state.clock),
            embed,
        )
        record = self.gemini.create_inline(ask, config["requests"]) if inline else self.gemini.create(ask, file_name)
        return Response(payload=record.to_api(), batch_id=record.id)

    def get(self, request: Request) -> Response:
        _version(request)
        record = self.gemini.get(request.params["batch_id"])
        return Response(payload=record.to_api(), batch_id=record.id)

    def cancel(self, request: Request) -> Response:
        _version(request)
        record = self.gemini.get(request.params["batch_id"])
        self.gemini.cancel(record, self.state.clock.now())
        return Response(payload={}, batch_id=record.id)

    def delete(self, request: Request) -> Response:
        _version(request)
        self.gemini.delete(request.params["batch_id"], self.state.clock.now())
        return Response(payload={}, batch_id=request.params["batch_id"])

    def list(self, request: Request) -> Response:
        _version(request)
        size, start = _page(request, 50, 1000)
        batches = self.gemini.newest_first()
        payload: dict[str, Any] = {"operations": [b.to_api(full=False) for b in batches[start : start + size]]}
        if start + size < len(batches):
            payload["nextPageToken"] = str(start + size)
        return Response(payload=payload)
