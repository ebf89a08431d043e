"""The sandbox's whole state: files, batches, ledger, request log, scenario and clock."""

from __future__ import annotations

import heapq
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from batch_pipeline.sandbox.anthropic.batches import AnthropicBatches
from batch_pipeline.sandbox.anthropic.responder import AnthropicRunner
from batch_pipeline.sandbox.batches import BatchRecord, Lifecycle, output_order
from batch_pipeline.sandbox.bedrock.jobs import BedrockJobs
from batch_pipeline.sandbox.bedrock.s3 import SandboxS3
from batch_pipeline.sandbox.clock import SandboxClock
from batch_pipeline.sandbox.errors import not_found
from batch_pipeline.sandbox.google.gemini_batches import GeminiService
from batch_pipeline.sandbox.google.gemini_files import GeminiFiles
from batch_pipeline.sandbox.google.responder import GeminiResponder
from batch_pipeline.sandbox.google.vertex_jobs import VertexJobs
from batch_pipeline.sandbox.ids import new_id
from batch_pipeline.sandbox.ledger import LEDGER_FILE, Ledger
from batch_pipeline.sandbox.openai.create_tokens import RequestKeeper
from batch_pipeline.sandbox.openai.processing import PROVIDER_BY_ENDPOINT, LineRunner, unprocessed_lines
from batch_pipeline.sandbox.openai.quota import (
    OUTPUT_PURPOSE,
    admit,
    load_provider,
    output_expired,
    output_expires_at,
)
from batch_pipeline.sandbox.openai.spooled_requests import SpooledRequests
from batch_pipeline.sandbox.openai.spooled_results import SpooledResults
from batch_pipeline.sandbox.openai.validation import parse_input
from batch_pipeline.sandbox.persistence import BLOB_DIR, StateDir
from batch_pipeline.sandbox.quotas import DEFAULT_ACCOUNT, LoadBook
from batch_pipeline.sandbox.scenarios import Scenario, account_fault, scenario_from_metadata
from batch_pipeline.sandbox.sightings import SIGHTINGS_FILE, Sightings
from batch_pipeline.sandbox.spool import Spool
from batch_pipeline.sandbox.spooled_parts import bill_rows

FILE_TTL_S = 30 * 24 * 3600
REQUEST_LOG_LIMIT = 100_000  # the request log keeps the most recent entries only


@dataclass
class StoredFile:
    """An uploaded or generated file; its bytes are in the spool at ``path`` (never in memory, never saved)."""

    id: str
    filename: str
    purpose: str
    created_at: float
    size: int
    path: Path = field(default=Path(), compare=False)

    def read(self) -> bytes:
        """The bytes whole (a batch input, when a batch is created from it)."""
        return self.path.read_bytes()

    def first_line(self) -> bytes:
        """The first non-blank line (b"" when there is none), read without loading the rest."""
        with self.path.open("rb") as source:
            return next((line for line in source if line.strip()), b"")

    def saved(self) -> dict[str, Any]:
        """The fields ``state.json`` keeps (as before the spool: the bytes are the blob named by ``id``)."""
        return {k: v for k, v in asdict(self).items() if k != "path"}

    def to_api(self, scenario: Scenario | None = None) -> dict[str, Any]:
        """The API ``OpenAIFile`` object; an output file ``expires_at`` by the scenario's ``retention_openai_s``."""
        expires = (
            output_expires_at(scenario, self.purpose, self.created_at, FILE_TTL_S)
            if scenario is not None
            else int(self.created_at + FILE_TTL_S)
        )
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.size,
            "created_at": int(self.created_at),
            "expires_at": expires,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
        }


class SandboxState:
    """Everything the sandbox remembers. Callers hold ``lock`` around any use."""

    def __init__(self, clock: SandboxClock, scenario: Scenario, state_dir: str | None = None) -> None:
        self.lock = threading.RLock()
        self.clock = clock
        self.startup_scenario = scenario
        self.store = StateDir(state_dir) if state_dir else None
        self.spool = Spool(self.store.root / BLOB_DIR if self.store is not None else None)
        self.ledger = Ledger(self.spool.path(LEDGER_FILE))
        self.seen_custom_ids = Sightings(self.spool.path(SIGHTINGS_FILE) if self.store is not None else None)
        self.seen_prompts: set[str] = set()
        self.book = LoadBook()  # enqueued load per (provider, account, model), for quotas and GET /_sandbox/load
        self.lifecycle = Lifecycle(LineRunner(self.seen_custom_ids, self.seen_prompts), self._finish)
        self.anthropic = AnthropicBatches(
            AnthropicRunner(self.seen_custom_ids, self.seen_prompts), self._bill, self.spool.root, self.book
        )
        self.bedrock = BedrockJobs(
            AnthropicRunner(self.seen_custom_ids, self.seen_prompts),
            self._bill,
            SandboxS3(),
            self.spool.root,
            self.book,
        )
        self.gemini_files = GeminiFiles(self.spool)
        self.gemini = GeminiService(
            GeminiResponder(self.seen_custom_ids, self.seen_prompts), self._bill, self.gemini_files, self.book
        )
        self.vertex = VertexJobs(
            GeminiResponder(self.seen_custom_ids, self.seen_prompts), self._bill, self.spool.root, load=self.book
        )
        self.reset(wipe_store=False)
        if self.store is not None:
            self._load()

    def reset(self, wipe_store: bool = True) -> None:
        """Forget files, batches, ledger, request log and counters; back to the startup scenario and real time."""
        for batch in getattr(self, "batches", {}).values():  # their input links and answer parts go too
            if isinstance(batch.requests, SpooledRequests):
                batch.requests.release()
            if isinstance(batch.results, SpooledResults):
                batch.results.release()
        self.files: dict[str, StoredFile] = {}
        self.outputs: list[tuple[float, str]] = []  # heap of (created_at, id) of output files: their retention
        self.batches: dict[str, BatchRecord] = {}
        self.requests: deque[dict[str, Any]] = deque(maxlen=REQUEST_LOG_LIMIT)
        self.fault_counts: dict[str, int] = {}
        self.seen_custom_ids.clear()
        self.seen_prompts.clear()
        self.book.clear()
        self.anthropic.clear()
        self.bedrock.clear()
        self.gemini.clear()
        self.gemini_files.clear()
        self.vertex.clear()
        self.scenario = self.startup_scenario
        self.clock.reset()
        if wipe_store and self.store is not None:
            self.store.clear()
        if wipe_store or self.store is None:
            self.ledger.clear()

    def close(self) -> None:
        """The sandbox stops: its temporary spool goes (a state directory stays, for the next start)."""
        self.spool.close()

    def set_scenario(self, scenario: Scenario) -> None:
        """Select the server-wide scenario (its 429/500 counters start over)."""
        self.scenario = scenario
        self.fault_counts.clear()

    # files -----------------------------------------------------------------------------------------------------
    def add_file(self, filename: str, purpose: str, data: bytes) -> StoredFile:
        """Store a new file (its bytes go to the spool)."""
        return self.add_file_chunks(filename, purpose, (data,))

    def add_file_chunks(self, filename: str, purpose: str, chunks: Iterator[bytes] | tuple[bytes, ...]) -> StoredFile:
        """Store a new file written from ``chunks`` straight to the spool."""
        file_id = new_id("file-")
        size = self.spool.write_chunks(file_id, chunks)
        stored = StoredFile(file_id, filename, purpose, self.clock.now(), size, self.spool.path(file_id))
        self.files[stored.id] = stored
        return stored

    def get_file(self, file_id: str) -> StoredFile:
        """A file by id (404 if unknown)."""
        if file_id not in self.files:
            raise not_found("File", file_id)
        return self.files[file_id]

    def delete_file(self, file_id: str) -> None:
        """Delete a file (404 if unknown)."""
        self.get_file(file_id)
        del self.files[file_id]
        self.spool.delete(file_id)

    # batches ---------------------------------------------------------------------------------------------------
    def create_batch(
        self,
        input_file: StoredFile,
        endpoint: str,
        completion_window: str,
        metadata: dict[str, str] | None,
        account: str = DEFAULT_ACCOUNT,
    ) -> BatchRecord:
        """A new batch in ``validating``; its scenario comes from metadata, else the server's. A batch whose input
        passes its checks holds its prompt tokens for ``account`` (or is refused by the server's quota)."""
        scenario = scenario_from_metadata(metadata) or self.scenario
        content = input_file.read()
        # each good request's tokens counted (a slice of requests at a time, ``RequestKeeper``) before the clock is
        # read: the batch exists once its input has been read; its bodies are dropped (SpooledRequests reads them
        # from the spool)
        keeper = RequestKeeper(endpoint, scenario)
        parsed = parse_input(content, endpoint, keeper)
        keeper.finish()
        fault = account_fault(scenario, [parsed.model], "openai")
        if fault is not None:
            raise fault
        errors = list(parsed.errors)
        if scenario.name == "fail_validation":
            errors += [
                {
                    "code": "invalid_request",
                    "message": "Rejected by sandbox scenario fail_validation.",
                    "param": None,
                    "line": int(line),
                }
                for line in scenario.param("lines")
            ]
        batch_id = new_id("batch_")
        link = self.spool.path(batch_id + ".input")
        requests = SpooledRequests.link(input_file.path, link, content, parsed.requests)
        batch = BatchRecord(
            id=batch_id,
            input_file_id=input_file.id,
            endpoint=endpoint,
            completion_window=completion_window,
            metadata=metadata,
            model=parsed.model,
            scenario=scenario,
            created_at=self.clock.now(),
            requests=requests,
            validation_errors=errors,
            order=output_order(content, len(parsed.requests)),
            results=SpooledResults(self.spool.root, batch_id),
        )
        self.batches[batch_id] = batch
        if not errors:
            admit(self.book, self.scenario, batch, account)
        return batch

    def get_batch(self, batch_id: str) -> BatchRecord:
        """A batch by id (404 if unknown)."""
        if batch_id not in self.batches:
            raise not_found("Batch", batch_id)
        return self.batches[batch_id]

    def advance_all(self) -> bool:
        """Bring every unfinished batch up to the clock; True if any changed."""
        now = self.clock.now()
        changed = False
        for batch in self.batches.values():
            changed = self.lifecycle.advance(batch, now) or changed
        changed = self._expire_outputs(now) or changed
        changed = self.anthropic.advance_all(now) or changed
        changed = self.bedrock.advance_all(now) or changed
        changed = self.gemini.advance_all(now) or changed
        changed = self.vertex.advance_all(now) or changed
        return changed

    def release_batch(self, batch: BatchRecord, at: float) -> None:
        """The batch no longer counts as enqueued (cancelling or ended)."""
        self.book.release(load_provider(batch.endpoint), batch.id, at)

    def _expire_outputs(self, now: float) -> bool:
        """Delete the output and error files past ``retention_openai_s`` (the server-wide scenario's), oldest
        first; a file deleted by its owner meanwhile is skipped."""
        changed = False
        while self.outputs and output_expired(self.scenario, OUTPUT_PURPOSE, self.outputs[0][0], now):
            _, file_id = heapq.heappop(self.outputs)
            if file_id in self.files:
                self.delete_file(file_id)
                changed = True
        return changed

    def _bill(self, entries: list[dict[str, Any]]) -> None:
        """Append billing entries to the ledger."""
        self.ledger.extend(entries)

    def _finish(self, batch: BatchRecord) -> None:
        """On reaching a terminal state: the answers' parts become the output/error files (with the error lines of
        the requests never run), the successful lines are billed, and the batch keeps its counts only."""
        at = getattr(batch, f"{batch.status}_at")
        self.release_batch(batch, at)
        results = batch.results
        if not isinstance(results, SpooledResults):  # not created here nor loaded: nothing was ever run
            results = batch.results = SpooledResults(self.spool.root, batch.id)
        results.add_errors(unprocessed_lines(batch))
        for part, attr, name in (("output", "output_file_id", "output"), ("errors", "error_file_id", "errors")):
            file_id = new_id("file-")
            size = results.take(part, self.spool.path(file_id))
            if size:
                filename = f"batch_{batch.id}_{name}.jsonl"
                stored = StoredFile(file_id, filename, OUTPUT_PURPOSE, at, size, self.spool.path(file_id))
                self.files[file_id] = stored
                heapq.heappush(self.outputs, (at, file_id))
                setattr(batch, attr, file_id)
        bill_rows(self.ledger.extend, results.billing(PROVIDER_BY_ENDPOINT[batch.endpoint], batch.model, at))
        batch.compact()

    # persistence -----------------------------------------------------------------------------------------------
    def save(self) -> None:
        """Write the state to the state directory, if one was given."""
        if self.store is None:
            return
        self.store.save(
            {
                "clock_now": self.clock.now(),
                "scenario": self.scenario.to_json(),
                "files": [f.saved() for f in self.files.values()],
                "batches": [b.to_json() for b in self.batches.values()],
                "ledger_bytes": self.ledger.size(),
                "fault_counts": self.fault_counts,
                "seen_bytes": self.seen_custom_ids.flush(),
                "seen_prompts": sorted(self.seen_prompts),
                "anthropic_batches": self.anthropic.to_json(),
                "bedrock_jobs": self.bedrock.to_json(),
                "gemini": {"files": self.gemini_files.to_json(), "batches": self.gemini.to_json()},
                "vertex_jobs": self.vertex.to_json(),
                "load": self.book.to_json(),
            }
        )

    def _load(self) -> None:
        assert self.store is not None
        saved = self.store.load()
        if saved is None:
            self.ledger.clear()
            self.seen_custom_ids.forget()
            return
        self.clock.restore(float(saved["clock_now"]))
        self.scenario = Scenario(**saved["scenario"])
        for item in saved["files"]:
            stored = StoredFile(**item, path=self.spool.path(item["id"]))
            self.files[stored.id] = stored
            if stored.purpose == OUTPUT_PURPOSE:
                heapq.heappush(self.outputs, (stored.created_at, stored.id))
        self.batches = {b["id"]: BatchRecord.load(b, self.spool.root) for b in saved["batches"]}
        self.ledger.restore(saved.get("ledger"), saved.get("ledger_bytes"))
        self.fault_counts = dict(saved["fault_counts"])
        self.seen_custom_ids.restore(saved.get("seen_custom_ids"), saved.get("seen_bytes"))
        self.seen_prompts.update(saved["seen_prompts"])
        self.anthropic.load(saved.get("anthropic_batches"))
        self.bedrock.load(saved.get("bedrock_jobs"))
        gemini = saved.get("gemini") or {}
        self.gemini_files.load(gemini.get("files"))
        self.gemini.load(gemini.get("batches"))
        self.vertex.load(saved.get("vertex_jobs"))
        self.book.load(saved.get("load"))
