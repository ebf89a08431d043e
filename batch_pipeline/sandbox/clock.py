"""A controllable clock: wall time that tests can freeze, scale and advance."""

from __future__ import annotations

import threading
import time
from typing import Any


class SandboxClock:
    """Seconds since the epoch, as seen by the sandbox.

    ``now() = anchor_value + (monotonic() - anchor_mono) * scale`` while running; a frozen clock only moves
    through ``advance``. All batch timestamps and lifecycle durations are measured on this clock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """Back to real time: not frozen, scale 1, no offset."""
        with self._lock:
            self._anchor_mono = time.monotonic()
            self._anchor_value = time.time()
            self._scale = 1.0
            self._frozen = False

    def now(self) -> float:
        """Current clock reading in seconds."""
        with self._lock:
            return self._now_locked()

    def _now_locked(self) -> float:
        if self._frozen:
            return self._anchor_value
        return self._anchor_value + (time.monotonic() - self._anchor_mono) * self._scale

    def _reanchor_locked(self) -> None:
        self._anchor_value = self._now_locked()
        self._anchor_mono = time.monotonic()

    def advance(self, seconds: float) -> float:
        """Jump forward by ``seconds`` (must be >= 0); returns the new reading."""
        if seconds < 0:
            raise ValueError("advance_s must be >= 0 (the clock never goes back)")
        with self._lock:
            self._reanchor_locked()
            self._anchor_value += seconds
            return self._anchor_value

    def set_frozen(self, frozen: bool) -> None:
        """Stop or restart the flow of time (the reading is kept)."""
        with self._lock:
            self._reanchor_locked()
            self._frozen = frozen

    def set_scale(self, scale: float) -> None:
        """Run ``scale`` clock seconds per real second (> 0)."""
        if scale <= 0:
            raise ValueError("scale must be > 0")
        with self._lock:
            self._reanchor_locked()
            self._scale = scale

    def snapshot(self) -> dict[str, Any]:
        """The clock as JSON: now, frozen, scale."""
        with self._lock:
            return {"now": self._now_locked(), "frozen": self._frozen, "scale": self._scale}

    def restore(self, now: float) -> None:
        """Continue from a persisted reading if it lies ahead of real time."""
        with self._lock:
            if now > self._now_locked():
                self._reanchor_locked()
                self._anchor_value = now
