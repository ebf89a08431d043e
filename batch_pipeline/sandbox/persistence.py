"""Optional persistence of the sandbox state to a directory: ``state.json`` plus one blob per file."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

STATE_FILE = "state.json"
BLOB_DIR = "files"


class StateDir:
    """Reads and writes the state of one sandbox in ``root`` (created if missing)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        (self.root / BLOB_DIR).mkdir(parents=True, exist_ok=True)

    def write_blob(self, file_id: str, data: bytes) -> None:
        """Store a file's bytes (written once, when the file is created)."""
        target = self.root / BLOB_DIR / file_id
        tmp = target.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, target)

    def read_blob(self, file_id: str) -> bytes:
        """A stored file's bytes."""
        return (self.root / BLOB_DIR / file_id).read_bytes()

    def delete_blob(self, file_id: str) -> None:
        """Forget a file's bytes."""
        (self.root / BLOB_DIR / file_id).unlink(missing_ok=True)

    def clear(self) -> None:
        """Remove every blob and the state document."""
        for blob in (self.root / BLOB_DIR).iterdir():
            blob.unlink(missing_ok=True)
        (self.root / STATE_FILE).unlink(missing_ok=True)

    def save(self, payload: dict[str, Any]) -> None:
        """Atomically replace ``state.json``."""
        target = self.root / STATE_FILE
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(payload), encoding="utf-8")
        os.replace(tmp, target)

    def load(self) -> dict[str, Any] | None:
        """The saved state document, or None when there is none."""
        target = self.root / STATE_FILE
        if not target.exists():
            return None
        loaded = json.loads(target.read_text(encoding="utf-8"))
        return loaded if isinstance(loaded, dict) else None
