"""Client-side rate limiting for online endpoints: a requests + tokens bucket, tightened by response headers.

Buckets refill continuously at ``limit / 60`` per second and hold at most one second's worth (``burst_s``), so a
configured RPM is never exceeded over any window: a request that needs more tokens than the bucket holds waits for a
full bucket and leaves it in debt. ``x-ratelimit-*`` response headers lower the limits (never raise them above the
configured ones) and, when the provider says nothing is left, hold every request until the provider's reset.
"""

import re
import threading
import time
from collections.abc import Callable, Mapping

_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m(?!s))?(?:(\d+(?:\.\d+)?)s)?(?:(\d+(?:\.\d+)?)ms)?")


def parse_duration(text: str | None) -> float | None:
    """``x-ratelimit-reset-*`` values such as ``1s``, ``6m0s``, ``120ms``, ``1h2m3.5s`` or a bare number, in seconds."""
    if not text:
        return None
    text = text.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    found = _DURATION.fullmatch(text)
    if not found or not any(found.groups()):
        return None
    hours, minutes, seconds, millis = (float(g) if g else 0.0 for g in found.groups())
    return hours * 3600 + minutes * 60 + seconds + millis / 1000


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(float(text))
    except ValueError:
        return None


class _Bucket:
    """One continuously refilled bucket (not thread-safe: the limiter holds its lock)."""

    def __init__(self, per_minute: float, burst_s: float, now: float) -> None:
        self.per_minute = per_minute
        self.rate = per_minute / 60.0
        self.capacity = max(1.0, self.rate * burst_s)
        self.level = self.capacity
        self.stamp = now

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
        self.stamp = now

    def wait_for(self, amount: float) -> float:
        """Seconds until ``amount`` may be taken (a request larger than the bucket waits for a full one)."""
        need = min(amount, self.capacity)
        return 0.0 if self.level >= need else (need - self.level) / self.rate


class RateLimiter:
    """Requests-per-minute and tokens-per-minute limits shared by every worker thread of one run."""

    def __init__(
        self,
        rpm: float | None = None,
        tpm: float | None = None,
        *,
        burst_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._burst_s = burst_s
        self._configured = {"requests": rpm, "tokens": tpm}
        now = clock()
        self._buckets: dict[str, _Bucket] = {
            kind: _Bucket(limit, burst_s, now) for kind, limit in self._configured.items() if limit
        }
        self._hold_until = 0.0
        self._seen: dict[str, str] = {}
        self.waited_s = 0.0  # total time callers spent waiting (for progress logs)

    @property
    def limits(self) -> dict[str, float]:
        """The limits in force, per minute."""
        with self._lock:
            return {kind: bucket.per_minute for kind, bucket in self._buckets.items()}

    def acquire(self, tokens: float, stop: threading.Event) -> bool:
        """Block until one request of ``tokens`` tokens may be sent; False if ``stop`` was set meanwhile."""
        started = None
        while True:
            with self._lock:
                if not self._buckets and self._hold_until == 0.0:
                    return True  # nothing configured or learned yet: the fast path
                now = self._clock()
                wait = self._hold_until - now
                if wait <= 0:
                    for bucket in self._buckets.values():
                        bucket.refill(now)
                    wait = max([0.0] + [b.wait_for(tokens if k == "tokens" else 1) for k, b in self._buckets.items()])
                    if wait <= 0:
                        for kind, bucket in self._buckets.items():
                            bucket.level -= tokens if kind == "tokens" else 1
                        if started is not None:
                            self.waited_s += now - started
                        return True
                if started is None:
                    started = now
            if stop.wait(min(wait, 0.25)):
                return False

    def pause(self, seconds: float) -> None:
        """Hold every request for ``seconds`` (after a 429 with retry-after: the limit is shared)."""
        with self._lock:
            self._hold_until = max(self._hold_until, self._clock() + seconds)

    def observe(self, headers: Mapping[str, str]) -> None:
        """Tighten the limits from ``x-ratelimit-*`` response headers (lower-case names)."""
        for kind in ("requests", "tokens"):
            limit_text = headers.get(f"x-ratelimit-limit-{kind}")
            remaining = _int(headers.get(f"x-ratelimit-remaining-{kind}"))
            if limit_text is not None and self._seen.get(kind) != limit_text:
                self._tighten(kind, limit_text)
            if remaining is not None and remaining <= 0:
                reset = parse_duration(headers.get(f"x-ratelimit-reset-{kind}"))
                if reset:
                    self.pause(reset)

    def _tighten(self, kind: str, limit_text: str) -> None:
        limit = _int(limit_text)
        with self._lock:
            self._seen[kind] = limit_text
            if limit is None or limit <= 0:
                return
            configured = self._configured[kind]
            target = float(min(limit, configured) if configured else limit)
            bucket = self._buckets.get(kind)
            if bucket is None or target < bucket.per_minute:
                now = self._clock()
                fresh = _Bucket(target, self._burst_s, now)
                if bucket is not None:
                    bucket.refill(now)
                    fresh.level = min(fresh.capacity, bucket.level)
                self._buckets[kind] = fresh
