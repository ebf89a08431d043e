"""A tiny stdlib client for the ``/_sandbox`` admin endpoints."""

from __future__ import annotations

import json
import urllib.request
from typing import Any


class SandboxAdmin:
    """Calls a running sandbox's admin API at ``base_url`` (``http://127.0.0.1:PORT``)."""

    def __init__(self, base_url: str, timeout: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode("utf-8")
        request = urllib.request.Request(self.base_url + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            return json.loads(response.read())

    def reset(self) -> None:
        """Forget everything (files, batches, ledger, log, counters, scenario, clock)."""
        self._call("POST", "/_sandbox/reset", {})

    def set_scenario(self, name: str, **params: Any) -> dict[str, Any]:
        """Select the server-wide scenario."""
        return dict(self._call("POST", "/_sandbox/scenario", {"name": name, "params": params}))

    def clock(self, **changes: Any) -> dict[str, Any]:
        """Read the clock, or change it with ``advance_s``, ``freeze`` and/or ``scale``."""
        if not changes:
            return dict(self._call("GET", "/_sandbox/clock"))
        return dict(self._call("POST", "/_sandbox/clock", changes))

    def ledger(self, offset: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        """The billing entries (all of them, or ``limit`` from ``offset``)."""
        query = f"?offset={offset}" + (f"&limit={limit}" if limit is not None else "")
        return list(self._call("GET", "/_sandbox/ledger" + query)["entries"])

    def load(self) -> dict[str, Any]:
        """The enqueued load over time: ``{"events": [...], "peak": [...], "refusals": N}``."""
        return dict(self._call("GET", "/_sandbox/load"))

    def requests(self) -> list[dict[str, Any]]:
        """The log of HTTP requests received."""
        return list(self._call("GET", "/_sandbox/requests")["requests"])
