"""The answer journal: a per-attempt write-ahead log of paid answers, durable before they are counted.

A stream executor whose answers cost money (the online endpoint) hands every finished answer to ``append`` before
it takes its next request, and ``append`` returns only once the answer is on disk. A committer thread writes and
fsyncs whatever accumulated while the previous fsync ran (a group commit: no fixed delay, so one fsync covers the
answers of every worker that finished meanwhile; ``MAX_GROUP`` lines at most). A SIGKILL therefore loses at most one
answer or one request per worker: the executor's ``concurrency``.

The journal is folded into result parts as today (each flush is a part); once the attempt is recorded it is
deleted. On restart, an attempt left open has its journal replayed into a part before anything is sent again:
rows already in a part are written again and deduplicate on read. A torn last line (the kill came mid-write) is
skipped. Lines are JSON arrays in ``RAW_RESULT_SCHEMA`` order (an embeddings row has its vector after them): chosen over Arrow IPC by
measurement (``benchmarks/journal_bench.py``): one answer per append, where a JSON line costs a few microseconds
and an IPC message per group costs more than the line it carries.

On a local home the journal is one append-only file; on an object store (which has no append) each group commit is
its own small object.
"""

import json
import logging
import os
import threading
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from batch_pipeline.core.ledger.executor import RAW_OPTIONAL_SCHEMA, RAW_RESULT_SCHEMA
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store

log = logging.getLogger(__name__)

MAX_GROUP = 512


def journal_rel(job: str, shard_id: str, attempt: int) -> str:
    return f"{JobPaths(job).root}/journal/{shard_id}/attempt-{attempt:04d}"


def _plain(value: Any) -> Any:
    """An embeddings row's vector (a NumPy array) as the list ``replay`` reads back."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"a journal row holds {type(value).__name__}, which JSON cannot hold")


class AnswerJournal:
    """One attempt's journal, open for appending (thread-safe); ``close`` waits for the last commit."""

    def __init__(self, store: Store, job: str, shard_id: str, attempt: int):
        self.store, self.rel = store, journal_rel(job, shard_id, attempt)
        self.local = store.local_path(self.rel + ".jsonl")
        self._file = None
        if self.local is not None:
            self.local.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.local, "ab")  # noqa: SIM115 (held open for the attempt, closed by close())
        self._segment = 0
        self._pending: list[bytes] = []
        self._appended = self._committed = 0
        self._cond = threading.Condition()
        self._closed = False
        self._error: BaseException | None = None
        self.commits = 0
        self._thread = threading.Thread(target=self._commit_loop, name=f"journal-{shard_id}-{attempt}", daemon=True)
        self._thread.start()

    def append(self, row: Sequence[Any]) -> None:
        """Make one finished answer durable; returns once it is on disk (raises if the journal cannot write)."""
        line = json.dumps(list(row), ensure_ascii=False, separators=(",", ":"), default=_plain).encode() + b"\n"
        with self._cond:
            if self._error is not None:
                raise self._error
            self._pending.append(line)
            self._appended += 1
            mine = self._appended
            self._cond.notify_all()
            while self._committed < mine and self._error is None:
                self._cond.wait()
            if self._error is not None:
                raise self._error

    def _commit_loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending and self._closed:
                    return
                group, self._pending = self._pending[:MAX_GROUP], self._pending[MAX_GROUP:]
            try:
                self._write(b"".join(group))
            except BaseException as exc:  # a full disk: every waiting worker hears it, nothing is counted
                with self._cond:
                    self._error = exc
                    self._cond.notify_all()
                return
            with self._cond:
                self._committed += len(group)
                self.commits += 1
                self._cond.notify_all()

    def _write(self, data: bytes) -> None:
        if self._file is not None:
            self._file.write(data)
            self._file.flush()
            os.fsync(self._file.fileno())
            return
        self._segment += 1
        self.store.write_bytes(f"{self.rel}/seg-{self._segment:08d}.jsonl", data)  # one PUT: whole or absent

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> "AnswerJournal":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def replay(store: Store, job: str, shard_id: str, attempt: int) -> pa.Table | None:
    """The answers an attempt's journal holds (None when it has none); a torn last line is skipped."""
    rel = journal_rel(job, shard_id, attempt)
    chunks: list[bytes] = []
    if store.exists(rel + ".jsonl"):
        chunks.append(store.read_bytes(rel + ".jsonl"))
    for seg in store.list_files(rel, suffix=".jsonl"):
        chunks.append(store.read_bytes(seg))
    rows = []
    for chunk in chunks:
        for line in chunk.splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                log.warning("journal %s: a torn line skipped (the process died mid-write)", store.uri(rel))
    if not rows:
        return None
    width = len(RAW_RESULT_SCHEMA)
    columns = list(zip(*[r[:width] + [None] * (width - len(r[:width])) for r in rows], strict=True))
    table = pa.Table.from_arrays(
        [pa.array(c, type=f.type) for c, f in zip(columns, RAW_RESULT_SCHEMA, strict=True)], schema=RAW_RESULT_SCHEMA
    )
    if any(len(r) > width for r in rows):  # an embeddings job's rows carry the vector after the raw columns
        field = RAW_OPTIONAL_SCHEMA.field("embedding")
        table = table.append_column(
            field, pa.array([r[width] if len(r) > width else None for r in rows], type=field.type)
        )
    return table


def discard(store: Store, job: str, shard_id: str, attempt: int) -> None:
    """The attempt is recorded: its journal has been folded into parts and is no longer needed."""
    rel = journal_rel(job, shard_id, attempt)
    if store.exists(rel + ".jsonl"):
        store.delete(rel + ".jsonl")
    for seg in store.list_files(rel, suffix=".jsonl"):
        store.delete(seg)
