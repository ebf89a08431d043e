"""The HTTP/1.1 front end (stdlib ``ThreadingHTTPServer``, keep-alive) and ``SandboxServer``."""

from __future__ import annotations

import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

from batch_pipeline.sandbox.anthropic.api import is_anthropic_path
from batch_pipeline.sandbox.anthropic.create_body import MAX_BYTES as ANTHROPIC_MAX_BYTES
from batch_pipeline.sandbox.anthropic.errors import as_anthropic
from batch_pipeline.sandbox.app import SandboxApp
from batch_pipeline.sandbox.errors import ApiError
from batch_pipeline.sandbox.openai.validation import MAX_BYTES
from batch_pipeline.sandbox.routing import Request, Response
from batch_pipeline.sandbox.scenarios import Scenario

ALLOWED_HOSTS = {"127.0.0.1": "127.0.0.1", "localhost": "127.0.0.1"}
MAX_BODY = max(MAX_BYTES, ANTHROPIC_MAX_BYTES) + 1024 * 1024  # the largest batch body plus framing


def loopback_host(host: str) -> str:
    """The address to bind for ``host``; anything but loopback is refused."""
    if host not in ALLOWED_HOSTS:
        raise ValueError(f"the sandbox binds to loopback only (127.0.0.1 or localhost), not {host!r}")
    return ALLOWED_HOSTS[host]


class _Handler(BaseHTTPRequestHandler):
    """Reads a request into a ``Request``, lets the app answer, writes the ``Response``."""

    protocol_version = "HTTP/1.1"
    server_version = "batch-pipeline-sandbox"
    timeout = 120  # idle keep-alive connections are closed after this many seconds
    disable_nagle_algorithm = True  # headers and body go out in separate writes; avoid the 40 ms delayed-ACK stall
    app: SandboxApp
    verbose = False

    def _serve(self) -> None:
        parts = urlsplit(self.path)
        headers = {k.lower(): v for k, v in self.headers.items()}
        try:
            body = self._read_body(headers)
        except ApiError as exc:
            self.close_connection = True
            if is_anthropic_path(parts.path):
                exc = as_anthropic(exc)
            self._write(Response(exc.status, exc.body(), dict(exc.headers)))
            return
        request = Request(self.command, parts.path.rstrip("/") or "/", dict(parse_qsl(parts.query)), headers, body)
        self._write(self.app.handle(request))

    def _read_body(self, headers: dict[str, str]) -> bytes:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return self._read_chunked()
        try:
            length = int(headers.get("content-length") or 0)
        except ValueError:
            raise ApiError(400, "Content-Length is not an integer.") from None
        if length > MAX_BODY:
            raise ApiError(413, f"The request body exceeds {MAX_BODY} bytes.", code="request_too_large")
        return self.rfile.read(length) if length else b""

    def _read_chunked(self) -> bytes:
        chunks: list[bytes] = []
        total = 0
        while True:
            try:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            except ValueError:
                raise ApiError(400, "Malformed chunked body.") from None
            if size == 0:
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(chunks)
            total += size
            if total > MAX_BODY:
                raise ApiError(413, f"The request body exceeds {MAX_BODY} bytes.", code="request_too_large")
            chunks.append(self.rfile.read(size))
            self.rfile.readline()

    def _write(self, response: Response) -> None:
        length, body = response.chunks()
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(length))
        for name, value in response.headers.items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            for chunk in body:
                self.wfile.write(chunk)

    do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _serve

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        if self.verbose:
            sys.stderr.write("sandbox: " + (format % args) + "\n")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128
    block_on_close = False  # do not wait for idle keep-alive connections on shutdown

    def handle_error(self, request, client_address) -> None:
        """A client that went away mid-request (killed, timed out) is normal here: no traceback for it."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class SandboxServer:
    """The sandbox on a background thread: ``SandboxServer(port=0).start()``, then ``.url`` and ``.stop()``."""

    def __init__(
        self,
        port: int = 0,
        host: str = "127.0.0.1",
        *,
        scenario: Scenario | None = None,
        state_dir: str | None = None,
        verbose: bool = False,
    ) -> None:
        self.app = SandboxApp(scenario, state_dir)
        handler = type("SandboxHandler", (_Handler,), {"app": self.app, "verbose": verbose})
        self._httpd = _Server((loopback_host(host), port), handler)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (useful with ``port=0``)."""
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (OpenAI clients use ``url + "/v1"`` as base_url)."""
        return f"http://127.0.0.1:{self.port}"

    def serve_forever(self) -> None:
        """Serve on the calling thread until ``stop()``."""
        self._httpd.serve_forever(poll_interval=0.2)

    def start(self) -> SandboxServer:
        """Serve on a daemon thread; returns self."""
        self._thread = threading.Thread(target=self.serve_forever, name="sandbox-http", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._httpd.server_close()
        self.app.state.close()

    def __enter__(self) -> SandboxServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
