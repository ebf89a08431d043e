"""Gemini Developer API files and batches, and the batches' clock-driven lifecycle (advanced lazily).

``BATCH_STATE_PENDING`` (``validating_s``) -> ``RUNNING`` (requests answered linearly over ``in_progress_s``,
then ``finalizing_s``) -> ``SUCCEEDED`` with a responses file, one line per request, ``{"key", "response"}`` or
``{"key", "error"}``. An input that does not parse ends ``FAILED`` (the operation's ``error`` says which line).
A cancel stops processing; ``cancelling_s`` later the batch is ``CANCELLED`` with a responses file of what was
answered. A batch still unfinished 48 h after creation, or at the end of ``in_progress`` under the ``expire``
scenario, is ``EXPIRED`` **with no responses file at all** (the Gemini semantics the pipeline must absorb).
Answered requests are billed when the batch ends with a responses file (never for an expired batch).

A batch of inline requests (``inputConfig.requests.requests``, what ``batches.create(src=[...])`` sends) has the
same lifecycle, quota and billing; its answers come back in the operation itself
(``output.inlinedResponses.inlinedResponses``, in input order, each ``{"response"|"error", "metadata"}``) instead
of a responses file.

An embeddings batch (``asyncBatchEmbedContent``: ``EmbedContentRequest`` lines, ``sandbox/google/gemini_embed.py``)
has the same lifecycle, quota, files and billing (input tokens only); its operation carries the
``EmbedContentBatch`` type URLs.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from batch_pipeline.sandbox.batches import lines_due, output_order
from batch_pipeline.sandbox.google.errors import RETRY_INFO, GoogleError, status_object
from batch_pipeline.sandbox.google.gemini_embed import (
    EMBED_METADATA_TYPE,
    EMBED_OUTPUT_TYPE,
    GeminiEmbedder,
    embed_problem,
    embed_tokens,
)
from batch_pipeline.sandbox.google.gemini_inputs import contents_problem, parse_inline, parse_input
from batch_pipeline.sandbox.google.responder import GeminiAnswer, GeminiResponder, prompt_tokens
from batch_pipeline.sandbox.ids import new_id
from batch_pipeline.sandbox.persistence import StateDir
from batch_pipeline.sandbox.quotas import DEFAULT_ACCOUNT, Load, LoadBook, quota, retry_after_s
from batch_pipeline.sandbox.scenarios import Scenario

EXPIRY_S = 48 * 3600
FILE_TTL_S = 48 * 3600
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED", "EXPIRED"})
# The ``@type`` URLs the live API answers with, on /v1 and /v1beta alike: its internal ``v1main`` package, not the
# version in the path (captured responses of real batches, file and inline, show exactly these strings).
METADATA_TYPE = "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch"
OUTPUT_TYPE = "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatchOutput"
MAX_INLINE_BYTES = 20 * 2**20  # the API's request payload limit, which bounds a create with inline requests
BLOB_PREFIX = "gemini-"
Bill = Callable[[list[dict[str, Any]]], None]


def rfc3339(value: float | None) -> str | None:
    """Clock seconds as an RFC 3339 UTC timestamp with microseconds (None stays None)."""
    if value is None:
        return None
    return datetime.fromtimestamp(value, UTC).isoformat().replace("+00:00", "Z")


def gemini_id() -> str:
    """Lower-case alphanumerics: the SDK extracts file names from URIs with ``[a-z0-9]+``."""
    return new_id("")[:16]


def sha256_hash(data: bytes) -> str:
    """A File's ``sha256Hash`` as the Files API writes it: base64 of the *hex* SHA-256 digest of the bytes (88
    characters; not base64 of the raw 32-byte digest that the field's ``bytes`` type would suggest)."""
    return base64.b64encode(hashlib.sha256(data).hexdigest().encode("ascii")).decode("ascii")


@dataclass
class GeminiFile:
    """An uploaded (``UPLOADED``) or generated (``GENERATED``, a responses file) file; bytes in memory."""

    id: str
    display_name: str | None
    mime_type: str
    created_at: float
    size: int
    source: str = "UPLOADED"
    data: bytes = b""
    sha256: str = ""  # ``sha256Hash``, set when the bytes are stored (``GeminiService.add_file``)

    def to_api(self, host: str, version: str) -> dict[str, Any]:
        """The ``File`` resource (int64 ``sizeBytes`` as a JSON string, as Google sends it)."""
        body: dict[str, Any] = {
            "name": f"files/{self.id}",
            "mimeType": self.mime_type,
            "sizeBytes": str(self.size),
            "createTime": rfc3339(self.created_at),
            "updateTime": rfc3339(self.created_at),
            "expirationTime": rfc3339(self.created_at + FILE_TTL_S),
            "sha256Hash": self.sha256,
            "uri": f"http://{host}/{version}/files/{self.id}",
            "state": "ACTIVE",
            "source": self.source,
        }
        if self.display_name:
            body["displayName"] = self.display_name
        if self.source == "GENERATED":
            body["downloadUri"] = f"http://{host}/download/{version}/files/{self.id}:download?alt=media"
        return body


@dataclass
class GeminiBatch:
    """All the sandbox knows about one batch. Times are clock seconds."""

    id: str
    display_name: str | None
    model: str
    input_file: str
    created_at: float
    scenario: Scenario
    requests: list[dict[str, Any]]  # {"key", "request"} (+ "metadata" for an inline request that has one)
    order: list[int]
    invalid: str | None = None  # why the input does not parse: the batch will fail
    state: str = "BATCH_STATE_PENDING"
    results: list[GeminiAnswer] = field(default_factory=list)
    cancel_at: float | None = None
    updated_at: float | None = None
    end_at: float | None = None
    output_file: str | None = None
    account: str = DEFAULT_ACCOUNT  # the key that created it: whose enqueued tokens it counts against
    inline: bool = False  # built from inline requests: answered in the operation, not in a responses file
    embed: bool = False  # an asyncBatchEmbedContent batch: EmbedContentRequests, answered with vectors

    def duration(self, key: str) -> float:
        return float(self.scenario.param(key))

    @property
    def start(self) -> float:
        return self.created_at + self.duration("validating_s")

    @property
    def processing_end(self) -> float:
        return self.start + self.duration("in_progress_s")

    @property
    def ended(self) -> bool:
        return self.state.removeprefix("BATCH_STATE_") in TERMINAL

    def stats(self) -> dict[str, str]:
        """``batchStats``: int64 counts as strings, and a count of 0 left out (proto3 JSON), as the API sends
        them (a pending batch has ``requestCount`` and ``pendingRequestCount`` only)."""
        ok = sum(1 for r in self.results if r.succeeded)
        failed = len(self.results) - ok
        pending = 0 if self.ended else len(self.requests) - len(self.results)
        counts = {
            "requestCount": len(self.requests),
            "successfulRequestCount": ok,
            "failedRequestCount": failed,
            "pendingRequestCount": pending,
        }
        return {name: str(count) for name, count in counts.items() if count}

    @property
    def has_output(self) -> bool:
        """Ended with answers to give back (SUCCEEDED or CANCELLED; FAILED and EXPIRED give none)."""
        return self.state in ("BATCH_STATE_SUCCEEDED", "BATCH_STATE_CANCELLED")

    def inlined_responses(self) -> list[dict[str, Any]]:
        """The answered requests of an inline batch in input order: ``{"response"}`` or ``{"error"}`` (a
        ``google.rpc.Status`` without ``details``: the SDK's ``JobError`` types them as strings and refuses the
        detail objects) plus the request's ``metadata`` when it had one. A cancelled batch gives only what was
        answered before the cancel, so match on ``metadata``, not on position."""
        answered = sorted(zip(self.order, self.results), key=lambda pair: pair[0])
        out: list[dict[str, Any]] = []
        for index, result in answered:
            if result.succeeded:
                item: dict[str, Any] = {"response": result.response}
            else:
                item = {"error": {k: v for k, v in (result.error or {}).items() if k != "details"}}
            metadata = self.requests[index].get("metadata")
            if metadata is not None:
                item["metadata"] = metadata
            out.append(item)
        return out

    def _output(self, full: bool) -> dict[str, Any]:
        """``GenerateContentBatchOutput``: the responses file, or the inline responses (left out of a list's
        view, as the live ``batches.list`` leaves them out: get the batch to read them)."""
        if not self.inline:
            return {"responsesFile": self.output_file} if self.output_file else {}
        responses = self.inlined_responses() if full else []
        return {"inlinedResponses": {"inlinedResponses": responses} if responses else {}}

    def to_api(self, full: bool = True) -> dict[str, Any]:
        """The batch as the long-running ``Operation`` the API answers with (``full=False``: as listed)."""
        metadata: dict[str, Any] = {
            "@type": EMBED_METADATA_TYPE if self.embed else METADATA_TYPE,
            "model": self.model,
            "displayName": self.display_name or "",
            "createTime": rfc3339(self.created_at),
            "updateTime": rfc3339(self.updated_at or self.created_at),
            "batchStats": self.stats(),
            "state": self.state,
            "name": f"batches/{self.id}",
        }
        if not self.inline:  # the live API does not echo inline requests back
            metadata["inputConfig"] = {"fileName": self.input_file}
        if self.end_at is not None:
            metadata["endTime"] = rfc3339(self.end_at)
        output = self._output(full) if self.has_output else {}
        if output:
            metadata["output"] = output
        operation: dict[str, Any] = {"name": f"batches/{self.id}", "metadata": metadata, "done": self.ended}
        if self.state == "BATCH_STATE_FAILED":
            operation["error"] = status_object(400, self.invalid or "The batch failed.")
        elif self.ended:
            operation["response"] = {"@type": EMBED_OUTPUT_TYPE if self.embed else OUTPUT_TYPE, **output}
        return operation

    def output_lines(self) -> bytes:
        lines = [
            {"key": r.key, "response": r.response} if r.succeeded else {"key": r.key, "error": r.error}
            for r in self.results
        ]
        return "".join(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n" for line in lines).encode(
            "utf-8"
        )

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["scenario"] = self.scenario.to_json()
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GeminiBatch:
        data = dict(data)
        data["scenario"] = Scenario(**data["scenario"])
        data["results"] = [GeminiAnswer(**r) for r in data["results"]]
        return cls(**data)


class GeminiService:
    """Files and batches of the Gemini API on one sandbox (callers hold the state lock)."""

    def __init__(
        self, responder: GeminiResponder, bill: Bill, store: StateDir | None, load: LoadBook | None = None
    ) -> None:
        self.responder = responder
        self.embedder = GeminiEmbedder(responder.seen_keys)
        self.bill = bill
        self.store = store
        self.book = load if load is not None else LoadBook()
        self.clear()

    def clear(self) -> None:
        self.files: dict[str, GeminiFile] = {}
        self.batches: dict[str, GeminiBatch] = {}
        self.uploads: dict[str, dict[str, Any]] = {}  # resumable sessions: {"file": GeminiFile, "data": bytearray}

    # files -------------------------------------------------------------------------------------------------
    def add_file(self, stored: GeminiFile) -> GeminiFile:
        stored.sha256 = sha256_hash(stored.data)
        self.files[stored.id] = stored
        if self.store is not None:
            self.store.write_blob(BLOB_PREFIX + stored.id, stored.data)
        return stored

    def get_file(self, file_id: str) -> GeminiFile:
        if file_id not in self.files:
            raise GoogleError(403, f"You do not have permission to access the File {file_id} or it may not exist.")
        return self.files[file_id]

    def delete_file(self, file_id: str) -> None:
        self.get_file(file_id)
        del self.files[file_id]
        if self.store is not None:
            self.store.delete_blob(BLOB_PREFIX + file_id)

    # batches -----------------------------------------------------------------------------------------------
    def create(
        self,
        model: str,
        display_name: str | None,
        file_name: str,
        scenario: Scenario,
        clock: Callable[[], float],
        account: str = DEFAULT_ACCOUNT,
        scale: float = 1.0,
        embed: bool = False,
    ) -> GeminiBatch:
        """A new batch (PENDING) of an uploaded JSONL file, created once its input has been read (``clock()``
        is read then). One whose input parses holds its prompt tokens for ``account`` until it ends; past the
        server's ``quota_enqueued_tokens`` the create is a 429 RESOURCE_EXHAUSTED instead. ``embed``: the
        lines are ``EmbedContentRequest`` s (``asyncBatchEmbedContent``)."""
        stored = self.get_file(file_name.removeprefix("files/"))
        requests, invalid = parse_input(stored.data, embed_problem if embed else contents_problem)
        return self._create(
            model,
            display_name,
            f"files/{stored.id}",
            requests,
            invalid,
            stored.data,
            scenario,
            clock,
            account,
            scale,
            embed=embed,
        )

    def create_inline(
        self,
        model: str,
        display_name: str | None,
        config: Any,
        scenario: Scenario,
        clock: Callable[[], float],
        account: str = DEFAULT_ACCOUNT,
        scale: float = 1.0,
        embed: bool = False,
    ) -> GeminiBatch:
        """A new batch of inline requests (``inputConfig.requests``): as ``create``, answered in the operation."""
        requests, invalid = parse_inline(config, embed_problem if embed else contents_problem)
        seed = json.dumps([r["request"] for r in requests], sort_keys=True).encode("utf-8")
        return self._create(
            model, display_name, "", requests, invalid, seed, scenario, clock, account, scale, inline=True, embed=embed
        )

    def _create(
        self,
        model: str,
        display_name: str | None,
        input_file: str,
        requests: list[dict[str, Any]],
        invalid: str | None,
        seed: bytes,
        scenario: Scenario,
        clock: Callable[[], float],
        account: str,
        scale: float,
        inline: bool = False,
        embed: bool = False,
    ) -> GeminiBatch:
        if scenario.name == "fail_validation":
            invalid = f"Line {scenario.param('lines')[0]} was rejected (sandbox scenario fail_validation)."
        name = model.removeprefix("models/")
        count = embed_tokens if embed else prompt_tokens
        for item in requests if invalid is None else []:
            item["prompt_tokens"] = count(model, item["request"])
        tokens, now = sum(int(r.get("prompt_tokens", 0)) for r in requests), clock()
        if invalid is None:
            self._check_quota(scenario, account, name, tokens, now, scale)
        batch = GeminiBatch(
            gemini_id(),
            display_name,
            model,
            input_file,
            now,
            scenario,
            requests,
            output_order(seed, len(requests)),
            invalid,
            account=account,
            inline=inline,
            embed=embed,
        )
        self.batches[batch.id] = batch
        if invalid is None:
            self.book.hold("gemini", f"batches/{batch.id}", account, {name: Load(tokens, len(requests), 1)}, now)
        return batch

    def _check_quota(self, scenario: Scenario, account: str, model: str, tokens: int, now: float, scale: float) -> None:
        cap = quota(scenario, "quota_enqueued_tokens")
        held = self.book.enqueued("gemini", account, model).tokens
        if not cap or held + tokens <= cap:
            return
        self.book.refuse("gemini", "", account, [model], now)
        ends = [
            b.processing_end + b.duration("finalizing_s")
            for b in self.batches.values()
            if not b.ended and b.account == account and b.model.removeprefix("models/") == model
        ]
        wait = retry_after_s(min(ends, default=now) - now, scale)
        raise GoogleError(
            429,
            f"Enqueued token limit reached for {model}. Limit: {cap} enqueued tokens "
            f"({held} enqueued in batches pending or running, {tokens} in this batch). Please "
            "retry after some of your batches have finished.",
            details=[{"@type": RETRY_INFO, "retryDelay": f"{wait}s"}],
        )

    def get(self, batch_id: str) -> GeminiBatch:
        if batch_id not in self.batches:
            raise GoogleError(404, f"Batch batches/{batch_id} not found.")
        return self.batches[batch_id]

    def newest_first(self) -> list[GeminiBatch]:
        return list(reversed(self.batches.values()))

    def cancel(self, batch: GeminiBatch, now: float) -> None:
        """Stop processing; the batch is CANCELLED ``cancelling_s`` later (400 once it has ended)."""
        self.advance(batch, now)
        if batch.ended:
            raise GoogleError(
                400, f"Batch batches/{batch.id} is already in state {batch.state} and cannot be cancelled."
            )
        if batch.cancel_at is None:
            if batch.state == "BATCH_STATE_RUNNING":
                self._process_until(batch, now)
            batch.cancel_at = now
            batch.updated_at = now

    def delete(self, batch_id: str, now: float = 0.0) -> None:
        self.get(batch_id)
        del self.batches[batch_id]
        self.book.release("gemini", f"batches/{batch_id}", now)

    def advance_all(self, now: float) -> bool:
        changed = False
        for batch in self.batches.values():
            changed = self.advance(batch, now) or changed
        return changed

    def advance(self, batch: GeminiBatch, now: float) -> bool:
        """Apply every transition due by ``now``; True if anything changed."""
        if batch.ended:
            return False
        before = (batch.state, len(batch.results))
        expires = batch.created_at + EXPIRY_S
        if batch.cancel_at is not None:
            due = batch.cancel_at + batch.duration("cancelling_s")
            if now >= due:
                self._close(batch, "BATCH_STATE_CANCELLED", due)
        elif now >= batch.start and batch.invalid is not None:
            self._close(batch, "BATCH_STATE_FAILED", batch.start)
        elif now >= batch.start:
            end = batch.processing_end
            done_at = end + batch.duration("finalizing_s")
            if expires < done_at and now >= expires:
                self._close(batch, "BATCH_STATE_EXPIRED", expires)
            elif batch.scenario.name == "expire" and now >= end:
                self._process_until(batch, end)
                self._close(batch, "BATCH_STATE_EXPIRED", end)
            else:
                batch.state = "BATCH_STATE_RUNNING"
                self._process_until(batch, min(now, end))
                if now >= done_at:
                    self._close(batch, "BATCH_STATE_SUCCEEDED", done_at)
        elif now >= expires:
            self._close(batch, "BATCH_STATE_EXPIRED", expires)
        changed = before != (batch.state, len(batch.results))
        if changed:
            batch.updated_at = batch.end_at if batch.ended else now
        return changed

    def _process_until(self, batch: GeminiBatch, at: float) -> None:
        due = lines_due(batch, batch.start, at)
        while len(batch.results) < due:
            item = batch.requests[batch.order[len(batch.results)]]
            if batch.embed:
                batch.results.append(
                    self.embedder.answer(
                        item["key"], batch.model, item["request"], batch.scenario, item.get("prompt_tokens")
                    )
                )
                continue
            batch.results.append(
                self.responder.answer(
                    item["key"], batch.model, item["request"], batch.scenario, batch.id, item.get("prompt_tokens")
                )
            )

    def _close(self, batch: GeminiBatch, state: str, at: float) -> None:
        batch.state, batch.end_at = state, at
        self.book.release("gemini", f"batches/{batch.id}", at)
        if state in ("BATCH_STATE_FAILED", "BATCH_STATE_EXPIRED"):
            return  # no responses, nothing billed
        if not batch.inline:  # the live API names the responses file after the batch: files/batch-<batch id>
            output = batch.output_lines()
            stored = self.add_file(
                GeminiFile(
                    f"batch-{batch.id}", f"batch-{batch.id}", "application/jsonl", at, len(output), "GENERATED", output
                )
            )
            batch.output_file = f"files/{stored.id}"
        self.bill(
            [
                {
                    "provider": "gemini",
                    "batch_id": f"batches/{batch.id}",
                    "custom_id": r.key,
                    "model": batch.model.removeprefix("models/"),
                    "input_tokens": r.prompt_tokens,
                    "cached_tokens": r.cached_tokens,
                    "output_tokens": r.output_tokens,
                    "billed_at": at,
                }
                for r in batch.results
                if r.succeeded
            ]
        )

    # persistence -------------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        files = [{k: v for k, v in asdict(f).items() if k != "data"} for f in self.files.values()]
        return {"files": files, "batches": [b.to_json() for b in self.batches.values()]}

    def load(self, saved: dict[str, Any] | None) -> None:
        saved = saved or {}
        for item in saved.get("files", []):
            stored = GeminiFile(**item)
            if self.store is not None:
                stored.data = self.store.read_blob(BLOB_PREFIX + stored.id)
            if not stored.sha256:  # saved before the hash was kept
                stored.sha256 = sha256_hash(stored.data)
            self.files[stored.id] = stored
        self.batches = {b["id"]: GeminiBatch.from_json(b) for b in saved.get("batches", [])}
