"""Transport-neutral requests and responses, and a router over path templates such as ``/v1/files/{file_id}``."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from batch_pipeline.sandbox.errors import ApiError
from batch_pipeline.sandbox.spool import FileBody


@dataclass
class Request:
    """An HTTP request as the handlers see it."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # lower-case names
    body: bytes = b""
    params: dict[str, str] = field(default_factory=dict)

    def json(self) -> dict[str, Any]:
        """The body as a JSON object (400 otherwise)."""
        try:
            value = json.loads(self.body or b"{}")
        except ValueError as exc:
            raise ApiError(400, f"The body is not valid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ApiError(400, "The body must be a JSON object.")
        return value

    def bearer(self) -> str:
        """The token of an ``Authorization: Bearer TOKEN`` header ("" without one)."""
        scheme, _, token = self.headers.get("authorization", "").partition(" ")
        return token.strip() if scheme.lower() == "bearer" else ""

    def presented_key(self, header: str) -> str:
        """The key in the provider's own ``header``, else a bearer token ("" when the request carries neither)."""
        return self.headers.get(header, "").strip() or self.bearer()

    def query_int(self, name: str, default: int, low: int, high: int, refuse: Callable[[bool], Exception]) -> int:
        """The integer query parameter ``name`` (``default`` when absent or empty); ``refuse(out_of_range)`` is the
        provider's own 400 for one that is not an integer (False) or not within ``low``..``high`` (True)."""
        raw = self.query.get(name)
        if raw is None or raw == "":
            return default
        try:
            value = int(raw)
        except ValueError:
            raise refuse(False) from None
        if not low <= value <= high:
            raise refuse(True)
        return value


@dataclass
class Response:
    """An HTTP response: a JSON value or raw bytes."""

    status: int = 200
    payload: dict[str, Any] | list[Any] | bytes | FileBody | None = None
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "application/json"
    batch_id: str | None = None  # for the request log

    def encode(self) -> bytes:
        """The body bytes whole (a spooled file read in full: the HTTP server streams it with ``chunks``)."""
        if isinstance(self.payload, FileBody):
            return b"".join(self.payload.chunks())
        if isinstance(self.payload, bytes):
            return self.payload
        return json.dumps(self.payload).encode("utf-8")

    def chunks(self) -> tuple[int, Iterable[bytes]]:
        """The body's length and its bytes in pieces: a spooled file a megabyte at a time, else one piece."""
        if isinstance(self.payload, FileBody):
            return self.payload.size, self.payload.chunks()
        data = self.encode()
        return len(data), (data,)


Handler = Callable[[Request], Response]


@dataclass(frozen=True)
class Route:
    """One endpoint: method, path template, name (used by scenarios) and handler."""

    method: str
    pattern: re.Pattern[str]
    name: str
    handler: Handler


class Router:
    """Matches a method and path to a route, capturing ``{name}`` segments."""

    def __init__(self) -> None:
        self.routes: list[Route] = []

    def add(self, method: str, template: str, name: str, handler: Handler) -> None:
        """Register ``handler`` for ``method template``."""
        regex = re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", template)
        self.routes.append(Route(method, re.compile(f"^{regex}$"), name, handler))

    def match(self, method: str, path: str) -> tuple[Route, dict[str, str]]:
        """The route and path parameters; 404 for an unknown path, 405 for a known path with another method."""
        allowed = []
        for route in self.routes:
            found = route.pattern.match(path)
            if found:
                if route.method == method:
                    return route, found.groupdict()
                allowed.append(route.method)
        if allowed:
            raise ApiError(405, f"Method {method} is not allowed on {path}; use {', '.join(sorted(set(allowed)))}.")
        raise ApiError(404, f"Unknown path {method} {path}.", code="unknown_url")
