"""How often each custom_id (or request key) was run, for ``line_errors`` and first-sighting markers, saved as an
append-only log rather than inside ``state.json``.

``state.json`` is rewritten at every change; holding the map, a 1M-request job made each save dump 1M entries
(~13 MB, ~0.3 CPU-s, ~50 us per request of a 300k job's CPU). With a state directory each change is now queued as a
JSON line ``[key, count]`` and appended to ``seen.jsonl`` at the save, and the state keeps the log's size: a
restart cuts the log back to it and replays it (the last count of a key wins).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

SIGHTINGS_FILE = "seen.jsonl"
_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


class Sightings(dict[str, int]):
    """The counts by key; with a ``path`` every ``self[key] = count`` is also queued for the log."""

    def __init__(self, path: Path | None = None) -> None:
        super().__init__()
        self.path = path
        self._pending: list[str] = []

    def __setitem__(self, key: str, count: int) -> None:
        super().__setitem__(key, count)
        if self.path is not None:
            self._pending.append(_ENCODE([key, count]))

    def clear(self) -> None:
        """No counts (the log stays until ``forget``: a restart reads it)."""
        super().clear()
        self._pending.clear()

    def forget(self) -> None:
        """No counts, the log emptied too (a reset)."""
        self.clear()
        if self.path is not None:
            self.path.write_bytes(b"")

    def flush(self) -> int:
        """Append the changes queued since the last flush; the log's size (the state saves it)."""
        assert self.path is not None, "only a sandbox with a state directory logs its sightings"
        with self.path.open("a", encoding="utf-8") as out:
            if self._pending:
                out.write("\n".join(self._pending) + "\n")
                self._pending.clear()
            return out.tell()

    def restore(self, saved: dict[str, int] | None, saved_bytes: int | None) -> None:
        """Back to a saved state: the map of a state saved before the log (it starts the log), or the log cut to
        the ``saved_bytes`` it had at the save and replayed."""
        assert self.path is not None
        if saved is not None or saved_bytes is None:
            self.forget()
        else:
            self.clear()
        if saved is not None:
            for key, count in saved.items():
                self[key] = int(count)
            self.flush()
            return
        if saved_bytes is None or not self.path.exists():
            return
        with self.path.open("r+b") as handle:
            handle.truncate(min(saved_bytes, os.fstat(handle.fileno()).st_size))
        with self.path.open(encoding="utf-8") as source:
            for line in source:
                key, count = json.loads(line)
                super().__setitem__(key, int(count))
