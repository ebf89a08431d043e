"""The online endpoints ``POST /v1/chat/completions`` (the batch responder answered at once) and
``POST /v1/embeddings`` (sandbox/openai/embeddings.py), with rate limits.

Every request counts against a fixed window of one sandbox-clock minute (``rpm`` requests and ``tpm`` tokens,
scenario parameters; tokens are estimated as prompt tokens plus ``max_tokens``, as OpenAI does). A request that
would exceed either gets a 429 with ``retry-after-ms`` and ``retry-after``; every answer carries the
``x-ratelimit-*`` headers. Each 200 is billed once in the ledger with ``"mode": "online"``.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from batch_pipeline.sandbox.errors import ApiError, bad_request
from batch_pipeline.sandbox.ids import new_id
from batch_pipeline.sandbox.openai import embeddings
from batch_pipeline.sandbox.responder import cacheable_prefix, chat_completion, markers, poison_message
from batch_pipeline.sandbox.routing import Request, Response, Router
from batch_pipeline.sandbox.state import SandboxState
from batch_pipeline.sandbox.tokens import request_input_tokens

CHAT_PATH = "/v1/chat/completions"
ENDPOINT = "chat_completions"
EMBEDDINGS_ENDPOINT = "embeddings"  # the scenario endpoint name of POST /v1/embeddings
KEY_PARAM = "request_key"  # cached in Request.params, read by the request log
DEFAULT_RPM = 1_000_000
DEFAULT_TPM = 1_000_000_000
MISSING = "missing_required_parameter"
# Window counters live in state.fault_counts, so a reset or a new scenario starts them over.
_MINUTE, _REQUESTS, _TOKENS = "chat_window|minute", "chat_window|requests", "chat_window|tokens"
_LINE_ERRORS_PREFIX = "chat:"  # sightings per request key, kept beside the batch custom_id sightings


def _messages_key(messages: Any) -> str:
    """A stable hash of a request's messages (identifies one logical request across retries)."""
    canonical = json.dumps(messages, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:32]


def request_key(request: Request) -> str | None:
    """The messages hash of a chat-completions request, the input hash of an embeddings request (None for other
    paths or an unreadable body)."""
    if request.path not in (CHAT_PATH, embeddings.EMBEDDINGS_URL):
        return None
    cached = request.params.get(KEY_PARAM)
    if cached is not None:
        return cached
    try:
        body = json.loads(request.body or b"{}")
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    key = (
        embeddings.request_key(body)
        if request.path == embeddings.EMBEDDINGS_URL
        else _messages_key(body.get("messages"))
    )
    request.params[KEY_PARAM] = key
    return key


def format_duration(seconds: float) -> str:
    """A reset time as OpenAI writes it: ``120ms``, ``1.5s``, ``6m0s``."""
    seconds = max(0.0, seconds)
    if seconds < 1:
        return f"{int(math.ceil(seconds * 1000))}ms"
    minutes, rest = divmod(seconds, 60)
    text = f"{rest:.3f}".rstrip("0").rstrip(".") + "s"
    return f"{int(minutes)}m{text}" if minutes else text


def _max_tokens(body: dict[str, Any]) -> int:
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return 0


class ChatApi:
    """Handler of ``POST /v1/chat/completions`` over a ``SandboxState`` (callers hold its lock)."""

    def __init__(self, state: SandboxState) -> None:
        self.state = state

    def register(self, router: Router) -> None:
        """Add the endpoints; their scenario endpoint names are ``chat_completions`` and ``embeddings``."""
        router.add("POST", CHAT_PATH, ENDPOINT, self.create)
        router.add("POST", embeddings.EMBEDDINGS_URL, EMBEDDINGS_ENDPOINT, self.embed)

    def _limits(self) -> tuple[int, int]:
        params = self.state.scenario.params
        return int(params.get("rpm", DEFAULT_RPM)), int(params.get("tpm", DEFAULT_TPM))

    def _admit(self, tokens: int) -> dict[str, str]:
        """Count the request in this minute's window and return the rate-limit headers; 429 if over a limit."""
        rpm, tpm = self._limits()
        clock = self.state.clock.snapshot()
        now = float(clock["now"])
        minute = int(now // 60)
        counts = self.state.fault_counts
        if counts.get(_MINUTE) != minute:
            counts[_MINUTE], counts[_REQUESTS], counts[_TOKENS] = minute, 0, 0
        clock_left = (minute + 1) * 60 - now
        left_s = clock_left if clock["frozen"] else clock_left / float(clock["scale"])
        over: str | None = None
        if counts[_REQUESTS] + 1 > rpm:
            over = "requests"
        elif counts[_TOKENS] + tokens > tpm:
            over = "tokens"
        else:
            counts[_REQUESTS] += 1
            counts[_TOKENS] += tokens
        reset = format_duration(left_s)
        headers = {
            "x-ratelimit-limit-requests": str(rpm),
            "x-ratelimit-remaining-requests": str(max(0, rpm - counts[_REQUESTS])),
            "x-ratelimit-reset-requests": reset,
            "x-ratelimit-limit-tokens": str(tpm),
            "x-ratelimit-remaining-tokens": str(max(0, tpm - counts[_TOKENS])),
            "x-ratelimit-reset-tokens": reset,
        }
        if over is not None:
            delay_ms = max(1, int(math.ceil(left_s * 1000)))
            limit, used, asked = (rpm, counts[_REQUESTS], 1) if over == "requests" else (tpm, counts[_TOKENS], tokens)
            raise ApiError(
                429,
                f"Rate limit reached for {over} per minute (sandbox): Limit {limit}, Used {used}, Requested {asked}. "
                f"Please try again in {delay_ms}ms.",
                type=over,
                code="rate_limit_exceeded",
                headers={**headers, "retry-after-ms": str(delay_ms), "retry-after": str(math.ceil(delay_ms / 1000))},
            )
        return headers

    def create(self, request: Request) -> Response:
        """Answer one chat completion: validate, rate-limit, apply markers and scenarios, bill a 200."""
        body = request.json()
        model, messages = body.get("model"), body.get("messages")
        if not isinstance(model, str) or not model:
            raise bad_request("Missing required parameter: 'model'.", param="model", code=MISSING)
        if not isinstance(messages, list) or not messages:
            raise bad_request("Missing required parameter: 'messages'.", param="messages", code=MISSING)
        if body.get("stream"):
            raise bad_request(
                "The sandbox does not stream; send stream: false.", param="stream", code="unsupported_value"
            )
        key = _messages_key(messages)
        request.params[KEY_PARAM] = key
        headers = self._admit(request_input_tokens(body) + _max_tokens(body))
        marks = markers(body)
        if "poison" in marks:
            raise _poisoned("messages", headers)
        self._line_error(key, headers)
        cached = 0
        prefix = cacheable_prefix(body)
        if prefix is not None:
            digest = hashlib.sha256(prefix[0].encode("utf-8")).hexdigest()
            cached = prefix[1] if digest in self.state.seen_prompts else 0
            self.state.seen_prompts.add(digest)
        now = self.state.clock.now()
        completion = chat_completion(
            body,
            completion_id=new_id("chatcmpl-"),
            created=int(now),
            cached_tokens=cached,
            truncate="truncate" in marks,
        )
        self.state.ledger.append(
            {
                "batch_id": None,
                "custom_id": None,
                "model": model,
                "input_tokens": completion.prompt_tokens,
                "cached_tokens": completion.cached_tokens,
                "output_tokens": completion.completion_tokens,
                "billed_at": now,
                "mode": "online",
                "completion_id": completion.body["id"],
                "request_key": key,
            }
        )
        return Response(payload=completion.body, headers=headers)

    def embed(self, request: Request) -> Response:
        """Answer one embeddings request: validate, rate-limit (input tokens), markers and scenarios, bill a 200.
        Fault markers apply the first time the sandbox sees the request's input."""
        body = request.json()
        try:
            model, texts, _, _ = embeddings.check_body(body)
        except embeddings.EmbeddingRequestError as exc:
            raise bad_request(str(exc), param=exc.param, code=exc.code) from None
        key = embeddings.request_key(body) or ""
        request.params[KEY_PARAM] = key
        headers = self._admit(embeddings.input_tokens(texts))
        if "poison" in embeddings.input_markers(body):
            raise _poisoned("input", headers)
        self._line_error(key, headers)
        seen_key = "embeddings:" + key
        sightings = self.state.seen_custom_ids.get(seen_key, 0)
        self.state.seen_custom_ids[seen_key] = sightings + 1
        payload, tokens = embeddings.embedding_response(body, first_sighting=sightings == 0)
        now = self.state.clock.now()
        self.state.ledger.append(
            {
                "batch_id": None,
                "custom_id": None,
                "model": model,
                "input_tokens": tokens,
                "cached_tokens": 0,
                "output_tokens": 0,
                "billed_at": now,
                "mode": "online",
                "completion_id": None,
                "request_key": key,
            }
        )
        return Response(payload=payload, headers=headers)

    def _line_error(self, key: str, headers: dict[str, str]) -> None:
        """The ``line_errors`` scenario: a selected request gets a 500 the first ``times`` times it is seen."""
        scenario = self.state.scenario
        if scenario.name != "line_errors":
            return
        seen_key = _LINE_ERRORS_PREFIX + key
        sightings = self.state.seen_custom_ids.get(seen_key, 0)
        self.state.seen_custom_ids[seen_key] = sightings + 1
        if scenario.line_error_due(key, sightings):
            raise ApiError(
                500,
                "The server had an error processing this request (sandbox scenario line_errors).",
                type="server_error",
                code="server_error",
                headers=headers,
            )


def _poisoned(param: str, headers: dict[str, str]) -> ApiError:
    """The ``poison`` marker's 400 for an online request (the batch line's is ``processing.fault_line``)."""
    return ApiError(400, poison_message(param), code="context_length_exceeded", param=param, headers=headers)
