"""The two executor shapes and the records they exchange with the runner.

An executor only talks to a backend; the runner owns intents, attempts, validation and the store.
Results travel as Arrow tables with ``RAW_RESULT_SCHEMA`` columns (and any of ``RAW_OPTIONAL_SCHEMA`` after
them) so that a provider output file of a million lines is ingested column-wise, not object by object. Results
are matched by ``request_id``, never by position.
"""

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from json.encoder import encode_basestring
from typing import Any, Protocol, runtime_checkable

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from batch_pipeline.core.spec.job import JobSpec, OutputSpec, SamplingSpec
from batch_pipeline.core.spec.quota import Retention

RAW_RESULT_SCHEMA = pa.schema(
    [
        ("request_id", pa.string()),
        ("http_status", pa.int32()),  # null when the request never got a response (expired, cancelled)
        ("output_text", pa.string()),
        ("finish_reason", pa.string()),
        ("input_tokens", pa.int64()),
        ("cached_tokens", pa.int64()),
        ("output_tokens", pa.int64()),
        ("error_code", pa.string()),
        ("error_message", pa.string()),
        ("provider_request_id", pa.string()),
        ("raw_payload", pa.string()),  # the provider's line, verbatim
    ]
)
# Columns an executor MAY add after the RAW_RESULT_SCHEMA ones; an absent one reads as 0 (``build_results``).
RAW_OPTIONAL_SCHEMA = pa.schema(
    [
        ("cache_write_tokens", pa.int64()),  # input tokens that wrote the provider's prompt cache (Anthropic
        # cache_creation_input_tokens); counted in input_tokens, billed apart
        ("embedding", pa.list_(pa.float32())),  # an embeddings job's vector (output.embedding); null elsewhere
    ]
)


def raw_table(rows: Sequence[tuple[Any, ...]]) -> pa.Table:
    """Result rows built one by one (tuples in ``RAW_RESULT_SCHEMA`` column order) as one table."""
    columns = list(zip(*rows))
    return pa.Table.from_arrays(
        [pa.array(c, type=f.type) for c, f in zip(columns, RAW_RESULT_SCHEMA, strict=True)], schema=RAW_RESULT_SCHEMA
    )


class ItemShape(StrEnum):
    """What an item's ``user_prompt`` holds."""

    TEXT = "text"  # one user message (a rendered template)
    TURNS = "turns"  # the row's chat turns as canonical JSON, ``[{"role": ..., "content": ...}, ...]``
    # (input.messages_field; core/manifest/messages.py writes it, the request ID hashes it)


@dataclass(frozen=True)
class RequestPlan:
    """What every request of a job shares: the stable prefix (system, few-shot examples) and the settings."""

    model: str
    system: str
    sampling: SamplingSpec | None  # None: an embeddings job (nothing is generated)
    output: OutputSpec
    examples: tuple[tuple[str, str], ...] = ()  # (role, content): prompt.examples, right after the system prompt
    shape: ItemShape = ItemShape.TEXT

    @classmethod
    def from_spec(cls, spec: JobSpec) -> "RequestPlan":
        return cls(
            model=spec.model,
            system=spec.prompt.system,
            sampling=spec.sampling,
            output=spec.output,
            examples=tuple((t.role, t.content) for t in spec.prompt.examples),
            shape=ItemShape.TURNS if spec.input.messages_field is not None else ItemShape.TEXT,
        )

    def example_turns(self) -> list[dict[str, str]]:
        return [{"role": role, "content": content} for role, content in self.examples]

    def row_turns(self, user_prompt: str) -> list[dict[str, str]]:
        """One item's own turns (user first and last, alternating)."""
        if self.shape is ItemShape.TURNS:
            return json.loads(user_prompt)
        return [{"role": "user", "content": user_prompt}]

    def turns(self, user_prompt: str) -> list[dict[str, str]]:
        """Everything after the system prompt, in order: the examples, then the item's turns."""
        return [*self.example_turns(), *self.row_turns(user_prompt)]

    def examples_json(self) -> str:
        """The examples as ``{"role","content"}`` JSON objects each followed by a comma (for splicing into a
        messages array ahead of ``row_turns_json``), serialised the same way in every request."""
        return "".join(_dumps(t) + "," for t in self.example_turns())

    def row_turns_json(self, user_prompt: str) -> str:
        """An item's turns as comma-separated ``{"role","content"}`` JSON objects, no brackets: the canonical
        JSON a TURNS item holds is spliced as it is, with no decode."""
        if self.shape is ItemShape.TURNS:
            return user_prompt[1:-1]
        # json.dumps(user_prompt, ensure_ascii=False) without a JSONEncoder built per call (once per request)
        text = (
            encode_basestring(user_prompt)
            if isinstance(user_prompt, str)
            else json.dumps(user_prompt, ensure_ascii=False)
        )
        return '{"role":"user","content":' + text + "}"

    def request_lines(self, head: str, mid: str, tail: str, items: pa.Table) -> bytes:
        """A batch input file: ``head + request_id + mid + row_turns_json(user_prompt) + tail`` and a newline per
        item of ``items``, in UTF-8, built column-wise in Polars, whose JSON string escaping is ``json.dumps``' with
        ``ensure_ascii=False`` (the same bytes as the lines made one by one: ~3 against ~11 us a request of ~1.4 kB,
        and no Python string per line)."""
        frame = pl.from_arrow(items.select(["request_id", "user_prompt"]))
        assert isinstance(frame, pl.DataFrame)
        if frame.height == 0:
            return b""
        if frame.null_count().sum_horizontal().item():  # a null would drop its line from concat_str: one by one
            turns = self.row_turns_json
            rows = zip(items.column("request_id").to_pylist(), items.column("user_prompt").to_pylist())
            return "".join(f"{head}{rid}{mid}{turns(prompt)}{tail}\n" for rid, prompt in rows).encode("utf-8")
        prompt = pl.col("user_prompt")
        if self.shape is ItemShape.TURNS:
            turns = prompt.str.slice(1, prompt.str.len_chars() - 2)  # the canonical array's brackets dropped
        else:
            turns = pl.struct(pl.lit("user").alias("role"), prompt.alias("content")).struct.json_encode()
        lines = pl.concat_str([pl.lit(head), pl.col("request_id"), pl.lit(mid), turns, pl.lit(tail + "\n")])
        return _joined(frame.select(lines).to_series().to_arrow(compat_level=pl.CompatLevel.oldest()))


def _joined(strings: pa.Array | pa.ChunkedArray) -> bytes:
    """The values of a string array end to end, copied once: its data buffer between the first and last offsets,
    when they hold exactly the values (they do for an array one expression built), else joined value by value."""
    array = strings.combine_chunks() if isinstance(strings, pa.ChunkedArray) else strings
    if not (pa.types.is_large_string(array.type) or pa.types.is_string(array.type)):
        array = array.cast(pa.large_string())
    width = np.int64 if pa.types.is_large_string(array.type) else np.int32
    _, offsets, data = array.buffers()
    ends = np.frombuffer(offsets, dtype=width)[array.offset : array.offset + len(array) + 1]
    start, stop = int(ends[0]), int(ends[-1])
    if stop - start != (pc.sum(pc.binary_length(array)).as_py() or 0):
        return b"".join(array.cast(pa.large_binary()).to_pylist())
    return data[start:stop].to_pybytes()


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


@dataclass
class ShardWork:
    """One attempt at the not-yet-succeeded items of one shard."""

    job: str
    shard_id: str
    attempt: int
    key: str  # job:shard:attempt; carried in provider metadata to re-attach after a crash
    plan: RequestPlan
    items: pa.Table  # request_id, user_prompt (text or turns JSON: plan.shape)
    account: str | None = None  # the account admission chose (a backend with several accounts), else None
    # a stream executor hands each paid answer (a raw row) here before it counts it: returns once it is durable
    journal: Callable[[Sequence[Any]], None] | None = None

    @property
    def request_ids(self) -> list[str]:
        return self.items.column("request_id").to_pylist()


class BatchState(StrEnum):
    VALIDATING = "validating"
    RUNNING = "running"
    FINALIZING = "finalizing"
    CANCELLING = "cancelling"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLED = "cancelled"
    FAILED = "failed"

    @property
    def ended(self) -> bool:
        return self in (BatchState.COMPLETED, BatchState.EXPIRED, BatchState.CANCELLED, BatchState.FAILED)


@dataclass(frozen=True)
class BatchHandle:
    backend: str
    batch_id: str
    key: str
    input_file_id: str | None = None
    account: str | None = None  # which of the backend's accounts holds the batch (``backend.settings.accounts``)

    def as_dict(self) -> dict[str, Any]:
        out = {"backend": self.backend, "batch_id": self.batch_id, "key": self.key, "input_file_id": self.input_file_id}
        return {**out, "account": self.account} if self.account is not None else out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "BatchHandle":
        return cls(d["backend"], d["batch_id"], d["key"], d.get("input_file_id"), d.get("account"))


@dataclass
class BatchStatus:
    state: BatchState
    provider_status: str
    total: int = 0
    completed: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    codes: list[str] = field(default_factory=list)  # the provider's error codes of a failed batch (errors: the text)


@runtime_checkable
class BatchExecutor(Protocol):
    """A provider batch API: submit returns at once; the provider works for up to its window."""

    name: str
    pricing: str  # "batch" or "online": which price applies
    max_requests_per_batch: int
    max_bytes_per_batch: int
    poll_interval_s: float

    def submit(self, work: ShardWork) -> BatchHandle: ...
    def poll(self, handle: BatchHandle) -> BatchStatus: ...
    def fetch(self, handle: BatchHandle) -> Iterator[pa.Table]: ...
    def cancel(self, handle: BatchHandle) -> None: ...
    def find(
        self, key: str, request_ids: Sequence[str] | None = None, not_before: str | None = None
    ) -> BatchHandle | None:
        """The batch an attempt created, after a crash: by key (metadata) where the provider keeps one,
        else by the attempt's request IDs and the time of its intent."""
        ...


@runtime_checkable
class StreamExecutor(Protocol):
    """A self-hosted engine or an online endpoint: results arrive while the shard runs."""

    name: str
    pricing: str

    def run(self, work: ShardWork) -> Iterator[pa.Table]: ...


@runtime_checkable
class DrainableStream(Protocol):
    """A stream executor that can hand over results it holds but has not yielded yet (its flush buffer), after
    ``run`` was interrupted: those requests were paid for, so the runner stores them before it stops."""

    def take_unflushed(self, key: str) -> pa.Table | None: ...


@runtime_checkable
class DiscardableBatch(Protocol):
    """A batch executor that can delete what an attempt left at the provider (its input, output and error files,
    the batch itself, or the objects in our own bucket) once the results are stored: ``backend.settings.retention``
    says whether to. ``discard`` is idempotent (a not-found counts as deleted) and returns what it deleted."""

    @property
    def retention(self) -> Retention: ...

    def discard(self, handle: BatchHandle) -> list[str]: ...
