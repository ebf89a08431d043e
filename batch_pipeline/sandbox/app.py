"""The sandbox application: routing, auth, injected faults, lazy batch advance and the request log."""

from __future__ import annotations

import hashlib
import sys
import time
import traceback

from batch_pipeline.sandbox.admin_api import AdminApi
from batch_pipeline.sandbox.anthropic.api import AnthropicApi, check_anthropic_auth, is_anthropic_path
from batch_pipeline.sandbox.anthropic.errors import as_anthropic
from batch_pipeline.sandbox.bedrock.api import BedrockApi, check_bedrock_auth, is_bedrock_path
from batch_pipeline.sandbox.bedrock.errors import as_bedrock
from batch_pipeline.sandbox.clock import SandboxClock
from batch_pipeline.sandbox.errors import ApiError
from batch_pipeline.sandbox.google.errors import as_google
from batch_pipeline.sandbox.google.gemini_api import GeminiApi, check_gemini_auth, is_gemini_request
from batch_pipeline.sandbox.google.vertex import VertexApi, check_vertex_auth, is_vertex_path
from batch_pipeline.sandbox.ids import new_id
from batch_pipeline.sandbox.openai.api import OpenAIApi, check_auth
from batch_pipeline.sandbox.openai.azure import AZURE_PREFIX, azure_api, check_azure_auth, is_azure_path
from batch_pipeline.sandbox.openai.chat import ChatApi, request_key
from batch_pipeline.sandbox.routing import Request, Response, Router
from batch_pipeline.sandbox.scenarios import Scenario, endpoint_fault, make_scenario, scenario_from_metadata
from batch_pipeline.sandbox.state import SandboxState

SANDBOX_HEADER = "x-sandbox"
BATCH_SCOPED_ENDPOINTS = ("retrieve_batch", "cancel_batch")


class SandboxApp:
    """Turns a ``Request`` into a ``Response``; one lock serialises all state access."""

    def __init__(self, scenario: Scenario | None = None, state_dir: str | None = None) -> None:
        self.state = SandboxState(SandboxClock(), scenario or make_scenario("normal"), state_dir)
        self.router = Router()
        OpenAIApi(self.state).register(self.router)
        azure_api(self.state).register(self.router)
        ChatApi(self.state).register(self.router)
        AnthropicApi(self.state).register(self.router)
        BedrockApi(self.state).register(self.router)
        VertexApi(self.state).register(self.router)
        AdminApi(self.state).register(self.router)
        self.gemini_router = Router()  # Gemini shares /v1/files and /v1/batches with OpenAI
        GeminiApi(self.state).register(self.gemini_router)

    def handle(self, request: Request) -> Response:
        """Answer one request; every response carries ``x-request-id`` and ``x-sandbox``."""
        request_id = new_id("req_")
        received_mono = time.monotonic()
        with self.state.lock:
            received_at = self.state.clock.now()
            changed = False
            try:
                changed = self.state.advance_all()
                response = self._dispatch(request)
            except ApiError as exc:
                exc = in_provider_envelope(exc, request)
                response = Response(exc.status, exc.body(), dict(exc.headers), batch_id=request.params.get("batch_id"))
            except Exception as exc:  # a sandbox bug: answer in the envelope, report on stderr
                traceback.print_exc(file=sys.stderr)
                error = ApiError(500, f"Sandbox internal error: {exc!r}", type="server_error", code="sandbox_bug")
                error = in_provider_envelope(error, request)
                response = Response(500, error.body(), {"x-should-retry": "false"})
            response.headers["x-request-id"] = request_id
            if is_anthropic_path(request.path):
                response.headers["request-id"] = request_id
            response.headers[SANDBOX_HEADER] = "openai-batch-emulator"
            self._log(request, response, request_id, received_at, received_mono)
            if changed or request.method != "GET":
                self.state.save()
        return response

    def _dispatch(self, request: Request) -> Response:
        if is_gemini_request(request):
            return self._dispatch_gemini(request)
        route, params = self.router.match(request.method, request.path)
        request.params = params
        bedrock, vertex = is_bedrock_path(request.path), is_vertex_path(request.path)
        if request.path.startswith(("/v1/", AZURE_PREFIX + "/")) or bedrock or vertex:
            if bedrock:
                check_bedrock_auth(request, self.state.scenario)
            elif vertex:
                check_vertex_auth(request)
            elif is_anthropic_path(request.path):
                check_anthropic_auth(request)
            elif is_azure_path(request.path):
                check_azure_auth(request)
            else:
                check_auth(request)
            owed = self._fault(route.name, request)
            if owed is not None:
                fault, scenario = owed
                if scenario.name == "server_error" and scenario.param("commit"):
                    route.handler(request)  # the work is done, but the client is told it failed
                raise fault
        return route.handler(request)

    def _dispatch_gemini(self, request: Request) -> Response:
        route, params = self.gemini_router.match(request.method, request.path)
        request.params = params
        check_gemini_auth(request)
        session = "upload_id" in request.query  # a chunk of a resumable upload: its own scenario endpoint
        owed = self._fault("gemini_upload_chunk" if session else route.name, request)
        if owed is not None:
            fault, scenario = owed
            if scenario.name == "server_error" and scenario.param("commit"):
                route.handler(request)
            if session:  # without this header the SDK re-sends the chunk three times
                fault.headers["x-goog-upload-status"] = "final"
            raise fault
        return route.handler(request)

    def _fault(self, endpoint: str, request: Request) -> tuple[ApiError, Scenario] | None:
        """A 429/500 owed by the server-wide scenario, or by the scenario of the batch concerned."""
        counts = self.state.fault_counts
        candidates: list[tuple[Scenario, str]] = [(self.state.scenario, "server")]
        batch_id = request.params.get("batch_id")
        if endpoint in BATCH_SCOPED_ENDPOINTS and batch_id in self.state.batches:
            candidates.append((self.state.batches[batch_id].scenario, batch_id))
        if endpoint == "create_batch":
            try:
                scenario = scenario_from_metadata(request.json().get("metadata"))
            except (ApiError, ValueError, AttributeError, TypeError):
                scenario = None
            if scenario is not None:
                candidates.append((scenario, "create:" + hashlib.sha256(request.body).hexdigest()))
        for scenario, scope in candidates:
            fault = endpoint_fault(scenario, endpoint, counts, scope)
            if fault is not None:
                return fault, scenario
        return None

    def _log(self, request: Request, response: Response, request_id: str, at: float, mono: float) -> None:
        retry = request.headers.get("x-stainless-retry-count")
        self.state.requests.append(
            {
                "method": request.method,
                "path": request.path,
                "status": response.status,
                "at": at,
                "monotonic": mono,
                "retry_count": int(retry) if retry and retry.isdigit() else None,
                "batch_id": response.batch_id or request.params.get("batch_id"),
                "request_id": request_id,
                "request_key": request_key(request),
            }
        )


def in_provider_envelope(error: ApiError, request: Request) -> ApiError:
    """``error`` as the provider the request was meant for shapes its errors (OpenAI's envelope otherwise)."""
    if is_gemini_request(request) or is_vertex_path(request.path):
        return as_google(error)
    if is_anthropic_path(request.path):
        return as_anthropic(error)
    if is_bedrock_path(request.path):
        return as_bedrock(error)
    return error
