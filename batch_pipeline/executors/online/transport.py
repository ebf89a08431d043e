"""How the online executor sends one chat-completions request: request bodies and two transports.

- ``HttpTransport``: the stdlib ``http.client``, one keep-alive connection per worker thread. It costs a few
  tens of microseconds of client CPU per request (the SDK costs over a millisecond), so it is the default.
- ``SdkTransport``: the real ``openai`` SDK (``max_retries=0``; ``with_raw_response`` for the headers), for
  proxies (``HTTPS_PROXY``) and anything else the SDK's HTTP client handles.

Both return a ``Reply``: the status, lower-cased headers and raw body, or the kind of connection failure.
"""

import http.client
import json
import ssl
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx2
import openai

from batch_pipeline.core.ledger.executor import RequestPlan
from batch_pipeline.executors.openai.format import body_settings, chat_messages, messages_head
from batch_pipeline.executors.tls import shared_tls_context

USER_AGENT = "batch-pipeline-online/1"


@dataclass
class Reply:
    """One HTTP exchange. ``status`` is None when no response arrived (``failure`` says why)."""

    status: int | None
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    failure: str | None = None  # "timeout" | "connection_error"
    detail: str = ""


class SplicedBody:
    """A request body whose settings (the same in every request, ``extra_body`` over them) are serialised once;
    each request's own part is spliced in after them (``inner``: the settings' JSON without its braces)."""

    def __init__(self, plan: RequestPlan, extra_body: dict[str, Any] | None, settings: dict[str, Any]) -> None:
        self.plan = plan
        self.extra_body = dict(extra_body or {})
        self.settings = {**settings, **self.extra_body}
        self.inner = json.dumps(self.settings, ensure_ascii=False, separators=(",", ":"))[1:-1]


class BodyBuilder(SplicedBody):
    """The request body for a prompt: the shared settings are serialised once and spliced in."""

    path = "/chat/completions"  # under the base URL (an embeddings job's builder: online/embeddings.py)

    @staticmethod
    def sdk_create(client: openai.OpenAI) -> Any:
        """The SDK call that sends this builder's ``kwargs``, with the raw response."""
        return client.chat.completions.with_raw_response.create

    def __init__(self, plan: RequestPlan, extra_body: dict[str, Any] | None) -> None:
        super().__init__(plan, extra_body, body_settings(plan))
        self._head = f'{{{self.inner},"messages":[{messages_head(plan)}'
        self._tail = "]}"
        self._turns = plan.row_turns_json
        max_tokens = self.settings.get("max_completion_tokens") or self.settings.get("max_tokens") or 0
        self._fixed_tokens = len(self._head.encode("utf-8")) / 4 + int(max_tokens)

    def data(self, prompt: str) -> bytes:
        """The JSON body bytes."""
        return (self._head + self._turns(prompt) + self._tail).encode("utf-8")

    def kwargs(self, prompt: str) -> dict[str, Any]:
        """Keyword arguments of ``chat.completions.create``."""
        body = body_settings(self.plan)
        return {**body, "messages": chat_messages(self.plan, prompt), "extra_body": self.extra_body or None}

    def estimate_tokens(self, prompt: str) -> float:
        """Tokens the provider will count against the TPM limit: body bytes / 4 + max_tokens."""
        return self._fixed_tokens + (len(prompt.encode("utf-8")) + 16) / 4


class Transport(Protocol):
    def send(self, prompt: str, retry: int) -> Reply: ...
    def close(self) -> None: ...


class HttpTransport:
    """One keep-alive ``http.client`` connection; not thread-safe (one per worker thread)."""

    def __init__(self, base_url: str, api_key: str | None, timeout_s: float, builder: BodyBuilder) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base_url must be an http(s) URL, not {base_url!r}")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._path = parts.path.rstrip("/") + builder.path
        self._timeout = timeout_s
        self._builder = builder
        self._headers = {"Content-Type": "application/json", "Accept": "application/json", "User-Agent": USER_AGENT}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._conn: http.client.HTTPConnection | None = None
        self._reused = False

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            if self._https:
                self._conn = http.client.HTTPSConnection(
                    self._host, self._port, timeout=self._timeout, context=ssl.create_default_context()
                )
            else:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
            self._reused = False
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def send(self, prompt: str, retry: int) -> Reply:
        data = self._builder.data(prompt)
        headers = {**self._headers, "x-stainless-retry-count": str(retry)}
        for fresh in (False, True):
            conn = self._connection()
            reused = self._reused
            try:
                conn.request("POST", self._path, data, headers)
                response = conn.getresponse()
                body = response.read()
            except TimeoutError as exc:
                self.close()
                return Reply(None, failure="timeout", detail=f"no response within {self._timeout} s ({exc})")
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as exc:
                self.close()
                if reused and not fresh:
                    continue  # an idle keep-alive connection the server had closed: resend once on a new one
                return Reply(None, failure="connection_error", detail=f"{type(exc).__name__}: {exc}")
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                return Reply(None, failure="connection_error", detail=f"{type(exc).__name__}: {exc}")
            self._reused = True
            if response.will_close:
                self.close()
            return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, body)
        raise AssertionError("unreachable")


class SdkTransport:
    """The ``openai`` SDK (thread-safe; one client shared by every worker)."""

    def __init__(
        self, base_url: str | None, api_key: str | None, timeout_s: float, concurrency: int, builder: BodyBuilder
    ) -> None:
        limits = httpx2.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        self._client = openai.OpenAI(
            api_key=api_key or "EMPTY",
            base_url=base_url,
            max_retries=0,
            timeout=timeout_s,
            http_client=openai.DefaultHttpxClient(limits=limits, verify=shared_tls_context()),
        )
        self._builder = builder

    def close(self) -> None:
        self._client.close()

    def send(self, prompt: str, retry: int) -> Reply:
        try:
            raw = self._builder.sdk_create(self._client)(
                **self._builder.kwargs(prompt), extra_headers={"x-stainless-retry-count": str(retry)}
            )
            response = raw.http_response
        except openai.APIStatusError as exc:
            response = exc.response
        except openai.APITimeoutError as exc:
            return Reply(None, failure="timeout", detail=str(exc))
        except openai.APIConnectionError as exc:
            return Reply(None, failure="connection_error", detail=f"{exc}: {exc.__cause__!r}")
        return Reply(response.status_code, {k.lower(): v for k, v in response.headers.items()}, response.content)
