"""Handlers of the Anthropic Message Batches endpoints (``/v1/messages/batches``, base_url without ``/v1``)."""

from __future__ import annotations

from batch_pipeline.sandbox.anthropic.batches import AnthropicBatch
from batch_pipeline.sandbox.anthropic.create_body import parse_create
from batch_pipeline.sandbox.anthropic.errors import AnthropicError, anthropic_error, invalid_request
from batch_pipeline.sandbox.ids import new_id
from batch_pipeline.sandbox.quotas import account_of, clock_scale, quota, retry_after_s
from batch_pipeline.sandbox.routing import Request, Response, Router
from batch_pipeline.sandbox.scenarios import account_fault
from batch_pipeline.sandbox.spool import FileBody
from batch_pipeline.sandbox.state import SandboxState

PREFIX = "/v1/messages"
BATCHES = "/v1/messages/batches"
BAD_KEY = "sk-sandbox-bad"
JSONL = "application/x-jsonl"


def is_anthropic_path(path: str) -> bool:
    """True for paths answered in the Anthropic envelope."""
    return path == PREFIX or path.startswith(PREFIX + "/")


def check_anthropic_auth(request: Request) -> None:
    """401 unless ``x-api-key`` or ``Authorization: Bearer`` carries a key (``sk-sandbox-bad`` is refused);
    400 without an ``anthropic-version`` header (any value is accepted)."""
    key = request.presented_key("x-api-key")
    if not key:
        raise AnthropicError(
            401, "x-api-key header is required (any key works on the sandbox).", type="authentication_error"
        )
    if key == BAD_KEY:
        raise AnthropicError(401, "invalid x-api-key", type="authentication_error")
    if not request.headers.get("anthropic-version", "").strip():
        raise invalid_request("anthropic-version: header is required")


def _int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    def refuse(out_of_range: bool) -> Exception:
        if out_of_range:
            return invalid_request(f"{name}: Input should be between {low} and {high}")
        return invalid_request(f"{name}: Input should be a valid integer")

    return request.query_int(name, default, low, high, refuse)


class AnthropicApi:
    """The Message Batches endpoints over a ``SandboxState`` (callers hold its lock)."""

    def __init__(self, state: SandboxState) -> None:
        self.state = state

    def register(self, router: Router) -> None:
        """Add the endpoints to ``router``; route names are the scenario endpoint names."""
        router.add("POST", BATCHES, "anthropic_create", self.create)
        router.add("GET", BATCHES, "anthropic_list", self.list)
        router.add("GET", BATCHES + "/{batch_id}", "anthropic_retrieve", self.retrieve)
        router.add("DELETE", BATCHES + "/{batch_id}", "anthropic_delete", self.delete)
        router.add("POST", BATCHES + "/{batch_id}/cancel", "anthropic_cancel", self.cancel)
        router.add("GET", BATCHES + "/{batch_id}/results", "anthropic_results", self.results)

    @property
    def _kept_s(self) -> float:
        """How long results stay after a batch was created (the server-wide ``retention_anthropic_s``)."""
        return float(self.state.scenario.param("retention_anthropic_s"))

    def _object(self, batch: AnthropicBatch, request: Request) -> Response:
        host = request.headers.get("host") or "127.0.0.1"
        return Response(payload=batch.to_api(self.state.clock.now(), host, self._kept_s), batch_id=batch.id)

    def create(self, request: Request) -> Response:
        """A batch of the body's requests, spooled as they are checked (``create_body.py``)."""
        batch_id = new_id("msgbatch_")
        parsed = parse_create(request.body, self.state.anthropic.requests_path(batch_id))
        scenario = self.state.scenario
        try:
            fault = account_fault(scenario, sorted(parsed.models), "anthropic")
            if fault is not None:
                raise fault
            account, now = account_of(request, "anthropic"), self.state.clock.now()
            self._check_queue(account, sorted(parsed.models), len(parsed.lines), now)
        except BaseException:
            parsed.lines.release()
            raise
        batch = self.state.anthropic.create(batch_id, parsed, scenario, now, account)
        return self._object(batch, request)

    def _check_queue(self, account: str, models: list[str], count: int, now: float) -> None:
        """429 ``rate_limit_error`` when the batch's requests would pass ``quota_enqueued_requests`` (the requests
        of the account's batches still processing); ``retry-after`` says when the queue next shrinks."""
        cap = quota(self.state.scenario, "quota_enqueued_requests")
        waiting = self.state.book.enqueued("anthropic", account).requests
        if not cap or waiting + count <= cap:
            return
        self.state.book.refuse("anthropic", "", account, models, now)
        next_end = self.state.anthropic.next_end(account)
        wait = retry_after_s((next_end if next_end is not None else now) - now, clock_scale(self.state.clock))
        raise AnthropicError(
            429,
            f"Your organization's batch processing queue is full: {waiting} requests are "
            f"waiting and this batch has {count}. Limit: {cap} requests in the processing "
            "queue. Please wait for batches in progress to end, then try again.",
            type="rate_limit_error",
            headers={"retry-after": str(wait)},
        )

    def retrieve(self, request: Request) -> Response:
        return self._object(self.state.anthropic.get(request.params["batch_id"]), request)

    def cancel(self, request: Request) -> Response:
        batch = self.state.anthropic.get(request.params["batch_id"])
        self.state.anthropic.cancel(batch, self.state.clock.now())
        return self._object(batch, request)

    def delete(self, request: Request) -> Response:
        batch_id = request.params["batch_id"]
        self.state.anthropic.delete(batch_id)
        return Response(payload={"id": batch_id, "type": "message_batch_deleted"}, batch_id=batch_id)

    def results(self, request: Request) -> Response:
        batch = self.state.anthropic.get(request.params["batch_id"])
        if batch.processing_status != "ended":
            raise invalid_request(
                f"Message batch {batch.id} is {batch.processing_status}; results are available "
                "once processing has ended."
            )
        if batch.archived_at(self.state.clock.now(), self._kept_s) is not None:
            raise anthropic_error(
                404,
                f"The results of message batch {batch.id} are no longer available: results "
                f"are kept {self._kept_s / 86400:g} days after a batch is created.",
            )
        body = FileBody.open(self.state.anthropic.results_path(batch), batch.results_size)
        return Response(payload=body, content_type=JSONL, batch_id=batch.id)

    def list(self, request: Request) -> Response:
        limit = _int_param(request, "limit", 20, 1, 1000)
        after, before = request.query.get("after_id"), request.query.get("before_id")
        if after and before:
            raise invalid_request("Only one of after_id and before_id may be given.")
        batches = self.state.anthropic.newest_first()
        ids = [b.id for b in batches]
        for name, cursor in (("after_id", after), ("before_id", before)):
            if cursor and cursor not in ids:
                raise invalid_request(f"{name}: unknown message batch id {cursor!r}")
        if before:
            end = ids.index(before)
            page, has_more = batches[max(0, end - limit) : end], end - limit > 0
        else:
            start = ids.index(after) + 1 if after else 0
            page, has_more = batches[start : start + limit], start + limit < len(batches)
        host = request.headers.get("host") or "127.0.0.1"
        now = self.state.clock.now()
        data = [b.to_api(now, host, self._kept_s) for b in page]
        return Response(
            payload={
                "data": data,
                "has_more": has_more,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None,
            }
        )
