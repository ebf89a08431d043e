"""The sandbox's own endpoints under ``/_sandbox`` (no auth): clock, scenario, ledger, load, request log, reset."""

from __future__ import annotations

from batch_pipeline.sandbox.errors import bad_request
from batch_pipeline.sandbox.routing import Request, Response, Router
from batch_pipeline.sandbox.scenarios import make_scenario
from batch_pipeline.sandbox.state import SandboxState


class AdminApi:
    """Control and inspection of a running sandbox (callers hold the state lock)."""

    def __init__(self, state: SandboxState) -> None:
        self.state = state

    def register(self, router: Router) -> None:
        """Add the admin endpoints to ``router``."""
        router.add("GET", "/_sandbox/health", "admin_health", self.health)
        router.add("GET", "/_sandbox/clock", "admin_clock", self.get_clock)
        router.add("POST", "/_sandbox/clock", "admin_clock", self.set_clock)
        router.add("GET", "/_sandbox/scenario", "admin_scenario", self.get_scenario)
        router.add("POST", "/_sandbox/scenario", "admin_scenario", self.set_scenario)
        router.add("GET", "/_sandbox/ledger", "admin_ledger", self.ledger)
        router.add("GET", "/_sandbox/load", "admin_load", self.load)
        router.add("GET", "/_sandbox/requests", "admin_requests", self.requests)
        router.add("POST", "/_sandbox/reset", "admin_reset", self.reset)

    def health(self, request: Request) -> Response:
        return Response(payload={"ok": True, "sandbox": True})

    def get_clock(self, request: Request) -> Response:
        return Response(payload=self.state.clock.snapshot())

    def set_clock(self, request: Request) -> Response:
        """``{"advance_s": X, "freeze": bool, "scale": Y}``; every key optional."""
        body = request.json()
        unknown = sorted(set(body) - {"advance_s", "freeze", "scale"})
        if unknown:
            raise bad_request(f"Unknown clock keys {unknown}; use advance_s, freeze, scale.")
        clock = self.state.clock
        try:
            if "freeze" in body:
                clock.set_frozen(bool(body["freeze"]))
            if "scale" in body:
                clock.set_scale(float(body["scale"]))
            if "advance_s" in body:
                clock.advance(float(body["advance_s"]))
        except (TypeError, ValueError) as exc:
            raise bad_request(str(exc)) from None
        self.state.advance_all()
        return Response(payload=clock.snapshot())

    def get_scenario(self, request: Request) -> Response:
        return Response(payload=self.state.scenario.to_json())

    def set_scenario(self, request: Request) -> Response:
        """``{"name": ..., "params": {...}}``; applies to batches created afterwards and to endpoint faults."""
        body = request.json()
        params = body.get("params") or {}
        if not isinstance(params, dict):
            raise bad_request("params must be an object.", param="params")
        try:
            scenario = make_scenario(body.get("name"), params)
        except ValueError as exc:
            raise bad_request(str(exc), param="name") from None
        self.state.set_scenario(scenario)
        return Response(payload=scenario.to_json())

    def ledger(self, request: Request) -> Response:
        """Every billing row, or a page of them (``?offset=N&limit=M``) with ``total`` for a ledger of millions."""
        offset = _count_param(request, "offset", 0) or 0
        limit = _count_param(request, "limit", None)
        ledger = self.state.ledger
        return Response(payload={"entries": list(ledger.rows(offset, limit)), "total": len(ledger)})

    def load(self, request: Request) -> Response:
        """The enqueued load over time: ``{"events", "peak", "refusals"}`` (see ``sandbox/quotas.py``)."""
        return Response(payload=self.state.book.report())

    def requests(self, request: Request) -> Response:
        return Response(payload={"requests": list(self.state.requests)})

    def reset(self, request: Request) -> Response:
        self.state.reset()
        return Response(payload={"ok": True})


def _count_param(request: Request, name: str, default: int | None) -> int | None:
    """A non-negative integer query parameter (``default`` when absent)."""
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    if not raw.isdigit():
        raise bad_request(f"{name} must be a non-negative integer.", param=name)
    return int(raw)
