"""Handlers of the OpenAI Files and Batches endpoints (under ``/v1``; Azure's shape under ``/openai``)."""

from __future__ import annotations

from typing import Any

from batch_pipeline.sandbox.batches import batch_object
from batch_pipeline.sandbox.errors import ApiError, bad_request
from batch_pipeline.sandbox.multipart import parse_multipart
from batch_pipeline.sandbox.openai.quota import check_create_rate, first_model, load_provider
from batch_pipeline.sandbox.openai.validation import CHAT_URL, EMBEDDINGS_URL, MAX_BYTES
from batch_pipeline.sandbox.quotas import account_of, clock_scale
from batch_pipeline.sandbox.routing import Request, Response, Router
from batch_pipeline.sandbox.scenarios import scenario_from_metadata
from batch_pipeline.sandbox.spool import FileBody
from batch_pipeline.sandbox.state import SandboxState

UPLOAD_PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")
BAD_KEY = "sk-sandbox-bad"
MISSING = "missing_required_parameter"
METADATA_MAX_PAIRS, METADATA_MAX_KEY, METADATA_MAX_VALUE = 16, 64, 512


def _int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    def refuse(out_of_range: bool) -> Exception:
        if out_of_range:
            return bad_request(f"{name} must be between {low} and {high}.", param=name, code="invalid_value")
        return bad_request(f"{name} must be an integer.", param=name)

    return request.query_int(name, default, low, high, refuse)


def _page(items: list[dict[str, Any]], after: str | None, limit: int) -> dict[str, Any]:
    """A cursor page: the items after the one with id ``after``, at most ``limit``."""
    if after:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise bad_request(f"Unknown cursor after={after!r}.", param="after")
        items = items[ids.index(after) + 1 :]
    data = items[:limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(items) > limit,
    }


def _check_metadata(metadata: Any) -> dict[str, str] | None:
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise bad_request("metadata must be an object of strings.", param="metadata")
    if len(metadata) > METADATA_MAX_PAIRS:
        raise bad_request(f"metadata holds at most {METADATA_MAX_PAIRS} pairs.", param="metadata")
    for key, value in metadata.items():
        if len(key) > METADATA_MAX_KEY:
            raise bad_request(f"metadata keys are at most {METADATA_MAX_KEY} characters.", param="metadata")
        if not isinstance(value, str):
            raise bad_request("metadata values must be strings.", param="metadata")
        if len(value) > METADATA_MAX_VALUE:
            raise bad_request(f"metadata values are at most {METADATA_MAX_VALUE} characters.", param="metadata")
    try:
        scenario_from_metadata(metadata)
    except ValueError as exc:
        raise bad_request(f"Bad sandbox scenario in metadata: {exc}", param="metadata") from None
    return dict(metadata)


class OpenAIApi:
    """The Files and Batches endpoints over a ``SandboxState`` (callers hold its lock). ``prefix`` and
    ``chat_url``: where they are served and the one batch endpoint they accept (Azure: ``/openai`` and
    ``/chat/completions``)."""

    def __init__(self, state: SandboxState, prefix: str = "/v1", chat_url: str = CHAT_URL) -> None:
        self.state = state
        self.prefix = prefix
        self.chat_url = chat_url
        # the batch endpoints accepted: OpenAI's chat and embeddings; Azure's (relative) chat URL alone
        self.endpoints = (chat_url, EMBEDDINGS_URL) if chat_url == CHAT_URL else (chat_url,)
        self.provider = load_provider(chat_url)  # the load ledger's: openai or azure

    def register(self, router: Router) -> None:
        """Add the endpoints to ``router``; route names are the scenario endpoint names."""
        p = self.prefix
        router.add("POST", f"{p}/files", "upload_file", self.upload_file)
        router.add("GET", f"{p}/files", "list_files", self.list_files)
        router.add("GET", f"{p}/files/{{file_id}}", "retrieve_file", self.retrieve_file)
        router.add("GET", f"{p}/files/{{file_id}}/content", "file_content", self.file_content)
        router.add("DELETE", f"{p}/files/{{file_id}}", "delete_file", self.delete_file)
        router.add("POST", f"{p}/batches", "create_batch", self.create_batch)
        router.add("GET", f"{p}/batches", "list_batches", self.list_batches)
        router.add("GET", f"{p}/batches/{{batch_id}}", "retrieve_batch", self.retrieve_batch)
        router.add("POST", f"{p}/batches/{{batch_id}}/cancel", "cancel_batch", self.cancel_batch)

    # files -----------------------------------------------------------------------------------------------------
    def upload_file(self, request: Request) -> Response:
        parts = parse_multipart(request.headers.get("content-type", ""), request.body)
        for name in ("purpose", "file"):
            if name not in parts:
                raise bad_request(f"Missing required parameter: {name!r}.", param=name, code=MISSING)
        purpose = parts["purpose"].data.decode("utf-8", "replace").strip()
        if purpose not in UPLOAD_PURPOSES:
            raise bad_request(f"Invalid purpose {purpose!r}; one of {', '.join(UPLOAD_PURPOSES)}.", param="purpose")
        data = parts["file"].data
        if purpose == "batch" and len(data) > MAX_BYTES:
            raise bad_request(f"Batch input files are limited to {MAX_BYTES} bytes.", param="file")
        stored = self.state.add_file(parts["file"].filename or "upload.jsonl", purpose, data)
        return Response(payload=stored.to_api(self.state.scenario))

    def list_files(self, request: Request) -> Response:
        limit = _int_param(request, "limit", 10000, 1, 10000)
        order = request.query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise bad_request("order must be asc or desc.", param="order")
        files = list(self.state.files.values())
        if order == "desc":
            files.reverse()
        purpose = request.query.get("purpose")
        items = [f.to_api(self.state.scenario) for f in files if not purpose or f.purpose == purpose]
        return Response(payload=_page(items, request.query.get("after"), limit))

    def retrieve_file(self, request: Request) -> Response:
        return Response(payload=self.state.get_file(request.params["file_id"]).to_api(self.state.scenario))

    def file_content(self, request: Request) -> Response:
        stored = self.state.get_file(request.params["file_id"])
        return Response(payload=FileBody.open(stored.path, stored.size), content_type="application/octet-stream")

    def delete_file(self, request: Request) -> Response:
        file_id = request.params["file_id"]
        self.state.delete_file(file_id)
        return Response(payload={"id": file_id, "object": "file", "deleted": True})

    # batches ---------------------------------------------------------------------------------------------------
    def create_batch(self, request: Request) -> Response:
        body = request.json()
        input_file_id = body.get("input_file_id")
        if not isinstance(input_file_id, str) or not input_file_id:
            raise bad_request("Missing required parameter: 'input_file_id'.", param="input_file_id", code=MISSING)
        endpoint = body.get("endpoint")
        if endpoint not in self.endpoints:
            raise bad_request(
                f"The sandbox supports only endpoint {' or '.join(self.endpoints)}.",
                param="endpoint",
                code="invalid_value",
            )
        if body.get("completion_window") != "24h":
            raise bad_request("completion_window must be '24h'.", param="completion_window", code="invalid_value")
        metadata = _check_metadata(body.get("metadata"))
        input_file = self.state.get_file(input_file_id)
        if input_file.purpose != "batch":
            raise bad_request(
                f"File {input_file_id} has purpose {input_file.purpose!r}, not 'batch'.", param="input_file_id"
            )
        account, now = account_of(request, self.provider), self.state.clock.now()
        check_create_rate(
            self.state.book,
            self.state.scenario,
            self.provider,
            account,
            first_model(input_file.first_line()),
            now,
            clock_scale(self.state.clock),
        )
        batch = self.state.create_batch(input_file, endpoint, "24h", metadata, account)
        self.state.book.note_create(self.provider, account, batch.created_at)
        return Response(payload=batch_object(batch), batch_id=batch.id)

    def retrieve_batch(self, request: Request) -> Response:
        batch = self.state.get_batch(request.params["batch_id"])
        return Response(payload=batch_object(batch), batch_id=batch.id)

    def cancel_batch(self, request: Request) -> Response:
        batch = self.state.get_batch(request.params["batch_id"])
        self.state.lifecycle.cancel(batch, self.state.clock.now())
        if batch.cancelling_at is not None:
            self.state.release_batch(batch, batch.cancelling_at)
        return Response(payload=batch_object(batch), batch_id=batch.id)

    def list_batches(self, request: Request) -> Response:
        limit = _int_param(request, "limit", 20, 1, 100)
        items = [batch_object(b) for b in reversed(list(self.state.batches.values()))]
        return Response(payload=_page(items, request.query.get("after"), limit))


def check_auth(request: Request) -> None:
    """401 unless ``Authorization: Bearer <non-empty key>``; the key ``sk-sandbox-bad`` is refused."""
    key = request.bearer()
    if not key:
        raise ApiError(401, "You didn't provide an API key: send 'Authorization: Bearer KEY' (any key works here).")
    if key == BAD_KEY:
        raise ApiError(401, f"Incorrect API key provided: {BAD_KEY}.", code="invalid_api_key")
