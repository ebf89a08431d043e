"""Deterministic ``GenerateContentResponse`` objects for one ``GenerateContentRequest`` (REST field names).

Shared by the Google batch emulators (a Developer API batch line, a Vertex prediction line): they differ in how a
line is wrapped, not in the answer. The answer honours the request's output contract: ``responseJsonSchema`` (or
the OpenAPI-subset ``responseSchema``) with ``responseMimeType: application/json`` gives a schema-valid JSON
document, ``text/x.enum`` a bare enum value, otherwise a short sentence. Markers in the user text:
``[[sandbox:poison]]`` fails the request (400 ``INVALID_ARGUMENT``), ``[[sandbox:refuse]]`` ends it with
``finishReason: SAFETY`` and no content, ``[[sandbox:truncate]]`` cuts it in half with ``MAX_TOKENS`` (as does a
``maxOutputTokens`` below the answer's length), ``[[sandbox:block]]`` blocks the prompt (``promptFeedback``).

Implicit caching: a ``systemInstruction`` of at least 1,024 tokens seen before (same model) is reported as
``cachedContentTokenCount`` (a part of ``promptTokenCount``, as Gemini counts it).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from batch_pipeline.sandbox.google.errors import status_object
from batch_pipeline.sandbox.ids import stable_fraction, stable_hex
from batch_pipeline.sandbox.responder import CACHE_MIN_TOKENS, MARKER_RE
from batch_pipeline.sandbox.scenarios import Scenario
from batch_pipeline.sandbox.schema_fill import fill_schema, pick_label
from batch_pipeline.sandbox.store import BilledTokens
from batch_pipeline.sandbox.tokens import count_tokens, input_tokens, truncate_tokens

SEEN_PREFIX = "gemini|"  # keys in the state's shared memories (keys seen, cached prefixes)
MODEL_VERSION_SUFFIX = "-sandbox-001"
# line_errors codes -> (HTTP code, message, ErrorInfo reason or None)
LINE_ERRORS = {
    "server_error": (500, "Internal error encountered (sandbox scenario line_errors).", None),
    "invalid_api_key": (400, "API key not valid. Please pass a valid API key.", "API_KEY_INVALID"),
    "insufficient_quota": (
        403,
        "This API method requires billing to be enabled (sandbox scenario line_errors).",
        "BILLING_DISABLED",
    ),
}


@dataclass
class GeminiAnswer:
    """One answered (``response``) or failed (``error``, a ``google.rpc.Status``) request and its tokens."""

    key: str
    model: str
    response: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0

    @property
    def succeeded(self) -> bool:
        return self.response is not None

    def billed(self) -> BilledTokens:
        """The tokens as billed (``prompt_tokens``: all of the input, the cached part included)."""
        return BilledTokens(
            input_tokens=self.prompt_tokens, cached_tokens=self.cached_tokens, output_tokens=self.output_tokens
        )


def _texts(content: Any) -> list[str]:
    parts = content.get("parts") if isinstance(content, dict) else None
    return [p["text"] for p in parts or [] if isinstance(p, dict) and isinstance(p.get("text"), str)]


def user_text(request: dict[str, Any]) -> str:
    """The text of the last ``user`` content of a request."""
    contents = request.get("contents") if isinstance(request.get("contents"), list) else []
    for content in reversed(contents):
        if isinstance(content, dict) and content.get("role", "user") == "user":
            return "\n".join(_texts(content))
    return ""


def system_text(request: dict[str, Any]) -> str:
    return "\n".join(_texts(request.get("systemInstruction")))


def json_schema_of(config: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON schema of ``responseJsonSchema``, or of ``responseSchema`` (OpenAPI types lower-cased)."""
    if isinstance(config.get("responseJsonSchema"), dict):
        return config["responseJsonSchema"]
    if isinstance(config.get("responseSchema"), dict):
        return _lower_types(config["responseSchema"])
    return None


def _lower_types(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: (v.lower() if k == "type" and isinstance(v, str) else _lower_types(v)) for k, v in node.items()}
    if isinstance(node, list):
        return [_lower_types(v) for v in node]
    return node


def steer(text: str, config: dict[str, Any], scenario: Scenario, key: str) -> str:
    """``skew_labels`` / ``wrong_labels``: a label marker appended to the text, as on the other APIs."""
    if scenario.name == "skew_labels":
        return f"{text} [[sandbox:label={scenario.param('label')}]]"
    if scenario.name == "wrong_labels" and stable_fraction("wrong_labels", key) < float(scenario.param("share")):
        schema = json_schema_of(config) or {}
        enum = ((schema.get("properties") or {}).get("label") or {}).get("enum") or schema.get("enum")
        if enum:
            return f"{text} [[sandbox:label=not:{pick_label(enum, text)}]]"
    return text


def prompt_tokens(model: str, request: dict[str, Any]) -> int:
    """The prompt tokens a request is billed for (``promptTokenCount``): the model family's tokens of the system
    instruction, the last user turn and the output schema, as the quote counts them."""
    config = request.get("generationConfig") if isinstance(request.get("generationConfig"), dict) else {}
    schema = config.get("responseJsonSchema") or config.get("responseSchema")
    return (
        input_tokens(system_text(request), model)
        + input_tokens(user_text(request), model)
        + (input_tokens(json.dumps(schema), model) if isinstance(schema, dict) else 0)
    )


def screen(
    seen_keys: dict[str, int], key: str, model: str, text: str, scenario: Scenario
) -> tuple[int, set[str], GeminiAnswer | None]:
    """What every request (generate or embed) goes through first: (how often ``key`` was seen before, counting
    this sighting; the markers in ``text``; the answer it gets whatever it asks: the ``poison`` marker's 400, or
    a fault of the ``line_errors`` scenario that is due, else None)."""
    seen_key = SEEN_PREFIX + key
    sightings = seen_keys.get(seen_key, 0)
    seen_keys[seen_key] = sightings + 1
    marks = set(MARKER_RE.findall(text))
    if "poison" in marks:
        message = "The input token count exceeds the maximum number of tokens allowed (sandbox marker poison)."
        return sightings, marks, GeminiAnswer(key, model, error=status_object(400, message))
    if scenario.line_error_due(key, sightings):
        return sightings, marks, line_error(key, model, scenario)
    return sightings, marks, None


def line_error(key: str, model: str, scenario: Scenario) -> GeminiAnswer:
    """The failed answer the ``line_errors`` scenario gives (its ``code``), for generate and embed requests."""
    code, message, reason = LINE_ERRORS.get(
        str(scenario.params.get("code", "server_error")), LINE_ERRORS["server_error"]
    )
    details = (
        [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason, "domain": "googleapis.com"}]
        if reason
        else None
    )
    return GeminiAnswer(key, model, error=status_object(code, message, details))


class GeminiResponder:
    """Answers requests; remembers how often each key was seen (``line_errors``) and which prefixes are cached."""

    def __init__(self, seen_keys: dict[str, int], seen_prompts: set[str]) -> None:
        self.seen_keys = seen_keys
        self.seen_prompts = seen_prompts

    def answer(
        self, key: str, model: str, request: dict[str, Any], scenario: Scenario, salt: str, prompt: int | None = None
    ) -> GeminiAnswer:
        """The answer to ``request`` (a ``GenerateContentRequest``) under ``scenario``; ``salt`` (the batch)
        makes the response ID unique; ``prompt``: its ``prompt_tokens`` when already counted."""
        text = user_text(request)
        _, marks, failed = screen(self.seen_keys, key, model, text, scenario)
        if failed is not None:
            return failed
        system = system_text(request)
        config = request.get("generationConfig") if isinstance(request.get("generationConfig"), dict) else {}
        prompt = prompt_tokens(model, request) if prompt is None else prompt
        cached = self._cached(model, system)
        response: dict[str, Any] = {
            "modelVersion": model.removeprefix("models/") + MODEL_VERSION_SUFFIX,
            "responseId": stable_hex(salt, key, "response", length=22),
        }
        usage: dict[str, Any] = {"promptTokenCount": prompt, "totalTokenCount": prompt}
        if cached:
            usage["cachedContentTokenCount"] = cached
        usage["promptTokensDetails"] = [{"modality": "TEXT", "tokenCount": prompt}]
        if "block" in marks:
            blocked = {"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": usage, **response}
            return GeminiAnswer(key, model, response=blocked, prompt_tokens=prompt, cached_tokens=cached)
        if "refuse" in marks:
            candidate: dict[str, Any] = {
                "finishReason": "SAFETY",
                "index": 0,
                "safetyRatings": [
                    {"category": "HARM_CATEGORY_DANGEROUS_CONTENT", "probability": "HIGH", "blocked": True}
                ],
            }
            output = 0
        else:
            rendered, output, finish = self._content(steer(text, config, scenario, key), system, config, marks)
            candidate = {
                "content": {"role": "model", "parts": [{"text": rendered}]},
                "finishReason": finish,
                "index": 0,
            }
        if output:
            usage["candidatesTokenCount"] = output
        usage["totalTokenCount"] = prompt + output
        response = {"candidates": [candidate], "usageMetadata": usage, **response}
        return GeminiAnswer(
            key, model, response=response, prompt_tokens=prompt, cached_tokens=cached, output_tokens=output
        )

    def _cached(self, model: str, system: str) -> int:
        tokens = input_tokens(system, model)
        if tokens < CACHE_MIN_TOKENS:
            return 0
        digest = SEEN_PREFIX + hashlib.sha256(f"{model}\x1e{system}".encode()).hexdigest()
        hit = digest in self.seen_prompts
        self.seen_prompts.add(digest)
        return tokens if hit else 0

    @staticmethod
    def _content(text: str, system: str, config: dict[str, Any], marks: set[str]) -> tuple[str, int, str]:
        """(text, output tokens, finishReason)."""
        schema = json_schema_of(config)
        mime = config.get("responseMimeType")
        if mime == "text/x.enum" and schema and schema.get("enum"):
            rendered = str(pick_label(schema["enum"], text))
        elif schema is not None and mime == "application/json":
            rendered = json.dumps(fill_schema(schema, text, system), ensure_ascii=False)
        elif mime == "application/json":
            rendered = json.dumps({"sandbox": True, "answer": " ".join(re.findall(r"\w+", text)[:8])})
        else:
            words = re.findall(r"\w+", MARKER_RE.sub(" ", text))
            rendered = f"Sandbox reply to: {' '.join(words[:8]) or 'an empty message'}."
        produced = count_tokens(rendered)
        limit = config.get("maxOutputTokens")
        limit = limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else None
        if "truncate" in marks:
            limit = min(limit, produced // 2) if limit is not None else produced // 2
        if limit is not None and (produced > limit or "truncate" in marks):
            rendered = truncate_tokens(rendered, limit)
            return rendered, count_tokens(rendered), "MAX_TOKENS"
        return rendered, produced, "STOP"
