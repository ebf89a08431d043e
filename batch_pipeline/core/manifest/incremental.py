"""Which input files a manifest generation reads: new, unchanged, grown or rewritten.

A file is known by its identity (URI, size, modification time) and by what the last generation read of it
(bytes and lines consumed, a digest of its head and of the bytes just before the end that was read). An
unchanged file is skipped; a JSONL file that grew and still starts with what was read is read from that
offset (an append); anything else that changed is read again from the start (a rewrite). The outcome of each
file goes into the generation record, which is also where the next generation finds the file states.
"""

import hashlib
from dataclasses import asdict, dataclass, field
from enum import Enum

from batch_pipeline.core.manifest.rows import InputFile

DIGEST_BYTES = 64 * 1024  # head and tail windows checked to call a grown file an append


class FileAction(str, Enum):
    READ = "read"  # first seen: read whole
    SKIPPED = "skipped"  # identity unchanged: nothing read
    APPENDED = "appended"  # grew, same head and tail of the part read before: read from the old end
    REREAD = "reread"  # changed otherwise: read whole again, its rows replace the earlier ones


@dataclass
class FileState:
    """What the manifest knows of one input file after a generation."""

    uri: str
    size: int
    mtime_ns: int | None
    format: str
    bytes_read: int  # offset just past the last newline read (the next append starts here)
    lines: int  # lines up to ``bytes_read``: the next append's first line is ``lines + 1``
    ends_clean: bool  # the read part ended with a newline (else a later append is read as a rewrite)
    head_digest: str
    tail_digest: str
    row_generations: list[int] = field(default_factory=list)  # generations whose rows parts hold its live rows
    action: FileAction = FileAction.READ

    def as_dict(self) -> dict:
        out = asdict(self)
        out["action"] = self.action.value
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "FileState":
        return cls(**{**d, "action": FileAction(d.get("action", "read"))})


@dataclass(frozen=True)
class FilePlan:
    """What this generation does with one file: read from ``offset`` (line ``first_line``), or nothing."""

    file: InputFile
    action: FileAction
    offset: int = 0
    first_line: int = 1
    prior: FileState | None = None

    @property
    def reads(self) -> bool:
        return self.action is not FileAction.SKIPPED


def _digest(f: InputFile, start: int, length: int) -> str:
    if length <= 0:
        return ""
    with f.fs.open_input_file(f.path) as handle:
        handle.seek(start)
        return hashlib.sha256(handle.read(length)).hexdigest()


def head_digest(f: InputFile, upto: int) -> str:
    return _digest(f, 0, min(DIGEST_BYTES, upto))


def tail_digest(f: InputFile, upto: int) -> str:
    start = max(0, upto - DIGEST_BYTES)
    return _digest(f, start, upto - start)


def plan_files(files: list[InputFile], prior: dict[str, FileState]) -> list[FilePlan]:
    """One plan per current input file, in input order."""
    plans = []
    for f in files:
        state = prior.get(f.uri)
        if state is None or state.format != f.format:
            plans.append(FilePlan(f, FileAction.READ if state is None else FileAction.REREAD, prior=state))
        elif state.size == f.size and state.mtime_ns == f.mtime_ns:
            plans.append(FilePlan(f, FileAction.SKIPPED, prior=state))
        elif _is_append(f, state):
            plans.append(FilePlan(f, FileAction.APPENDED, state.bytes_read, state.lines + 1, state))
        else:
            plans.append(FilePlan(f, FileAction.REREAD, prior=state))
    return plans


def _is_append(f: InputFile, state: FileState) -> bool:
    """Grew past what was read, ends that part with a newline, and the head and tail of that part are the same
    bytes as before (plain JSONL only: a CSV header, a Parquet footer or a compressed stream makes any change a
    rewrite)."""
    if f.format != "jsonl" or f.compression is not None or not state.ends_clean or f.size <= state.bytes_read:
        return False
    return (
        head_digest(f, state.bytes_read) == state.head_digest and tail_digest(f, state.bytes_read) == state.tail_digest
    )


def state_after(plan: FilePlan, generation: int, bytes_read: int, lines: int, ends_clean: bool) -> FileState:
    """The file's state once this generation has read it (``bytes_read`` and ``lines`` count from the start)."""
    f, prior = plan.file, plan.prior
    if plan.action is FileAction.SKIPPED:
        assert prior is not None
        return FileState(**{**asdict(prior), "action": FileAction.SKIPPED})
    row_gens = [*prior.row_generations, generation] if plan.action is FileAction.APPENDED and prior else [generation]
    return FileState(
        f.uri,
        f.size,
        f.mtime_ns,
        f.format,
        bytes_read,
        lines,
        ends_clean,
        head_digest(f, bytes_read),
        tail_digest(f, bytes_read),
        row_gens,
        plan.action,
    )
