"""The sandbox's file bodies on disk: one blob per file in a directory, written once, read in chunks.

Batch inputs (up to 200 MB each), generated output and error files and the billing ledger grow with the job; kept
in memory they took the sandbox to 10 GB on a 1M-row job. The spool is the ``--state-dir``'s ``files/`` when one is
given (the blobs persistence always wrote there), else a temporary directory removed when the sandbox stops.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

CHUNK_BYTES = 1024 * 1024  # downloads and copies go a megabyte at a time


@dataclass(frozen=True)
class FileBody:
    """A response body sent from a spooled file, opened when the response is made (under the state lock), so a
    file deleted or expired before it is sent still sends whole: the open handle outlives the unlink."""

    source: BinaryIO
    size: int

    @classmethod
    def open(cls, path: Path, size: int) -> FileBody:
        return cls(path.open("rb"), size)

    def chunks(self, size: int = CHUNK_BYTES) -> Iterator[bytes]:
        """The bytes ``size`` at a time; the file is closed at the end."""
        with self.source:
            while chunk := self.source.read(size):
                yield chunk


class Spool:
    """Blobs by name in ``root``; ``owned`` roots (a temporary directory) are removed by ``close``."""

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.owned = root is None
        self.root = Path(tempfile.mkdtemp(prefix="sandbox-spool-")) if root is None else Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        # a sandbox dropped without stop() (a test's app, an interpreter exit) still removes its temporary spool
        self._finalizer = weakref.finalize(self, _remove, self.root if self.owned else None)

    def path(self, name: str) -> Path:
        """Where the blob ``name`` lives."""
        return self.root / name

    def write(self, name: str, data: bytes) -> int:
        """Store ``data`` under ``name`` (atomically replaced); its size."""
        return self.write_chunks(name, (data,))

    def write_chunks(self, name: str, chunks: Iterable[bytes | bytearray]) -> int:
        """Store the concatenation of ``chunks`` without holding it whole; its size."""
        target = self.path(name)
        tmp = target.with_name(target.name + ".tmp")
        size = 0
        with tmp.open("wb") as out:
            for chunk in chunks:
                out.write(chunk)
                size += len(chunk)
        os.replace(tmp, target)
        return size

    def read(self, name: str) -> bytes:
        """A blob's bytes whole (for the parsers that need them: one batch input at a time)."""
        return self.path(name).read_bytes()

    def delete(self, name: str) -> None:
        """Forget a blob."""
        self.path(name).unlink(missing_ok=True)

    def clear(self) -> None:
        """Remove every blob (the directory stays)."""
        for blob in self.root.iterdir():
            if blob.is_file():
                blob.unlink(missing_ok=True)

    def close(self) -> None:
        """Remove the directory if the spool made it; a state directory's blobs stay for the next start."""
        self._finalizer()


def _remove(root: Path | None) -> None:
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)
