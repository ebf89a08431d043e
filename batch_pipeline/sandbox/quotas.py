"""Account quotas: the enqueued load per (provider, account, model), the load ledger, and whose account a request is.

A quota is an account's property, so its figures come from the server-wide scenario (``quota_*`` and
``max_records_per_job`` in ``COMMON_PARAMS``; 0 = off), never from a per-batch one. Each provider module asks
``LoadBook.enqueued`` before it admits a batch, then ``hold``s the batch's load while the provider counts it as
waiting and ``release``s it when the batch leaves those states; a batch a quota refuses is ``refuse``d and never
held, so ``GET /_sandbox/load`` can show that no cap was passed.
"""

from __future__ import annotations

import math
import re
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from batch_pipeline.sandbox.clock import SandboxClock
from batch_pipeline.sandbox.routing import Request

PROVIDERS = ("openai", "azure", "anthropic", "gemini", "vertex", "bedrock")
DEFAULT_ACCOUNT = "default"
HOUR_S = 3600.0
RETRY_AFTER_MAX_S = 60  # SDKs sleep what they are told (anthropic: any value): keep the ask short
_SIGV4_KEY = re.compile(r"Credential=([^/,\s]+)/")


@dataclass(frozen=True)
class Load:
    """What one batch (or a whole key) holds: prompt tokens, requests and jobs."""

    tokens: int = 0
    requests: int = 0
    jobs: int = 0

    def __add__(self, other: Load) -> Load:
        return Load(self.tokens + other.tokens, self.requests + other.requests, self.jobs + other.jobs)

    def __sub__(self, other: Load) -> Load:
        return Load(self.tokens - other.tokens, self.requests - other.requests, self.jobs - other.jobs)


def account_of(request: Request, provider: str) -> str:
    """The account a request is made for: the key it presents (OpenAI/Azure/Anthropic/Gemini), the SigV4 access
    key id (Bedrock) or the project in the path (Vertex); ``default`` when there is none."""
    headers = request.headers
    if provider == "azure":
        key = request.presented_key("api-key")
    elif provider == "anthropic":
        key = request.presented_key("x-api-key")
    elif provider == "gemini":
        key = headers.get("x-goog-api-key", "").strip() or request.query.get("key", "").strip()
    elif provider == "bedrock":
        found = _SIGV4_KEY.search(headers.get("authorization", ""))
        key = found.group(1) if found else ""
    elif provider == "vertex":
        key = request.params.get("project", "")
    else:
        key = request.bearer()
    return key or DEFAULT_ACCOUNT


def quota(scenario: Any, name: str) -> int:
    """A quota figure of the server-wide scenario (0: off)."""
    return int(scenario.params.get(name, 0) or 0)


def clock_scale(clock: SandboxClock) -> float:
    """Clock seconds per real second (1 while frozen: a wait is then told in clock seconds)."""
    snap = clock.snapshot()
    return 1.0 if snap["frozen"] else float(snap["scale"])


def retry_after_s(clock_seconds: float, scale: float, cap: int | None = RETRY_AFTER_MAX_S) -> int:
    """Whole real seconds (at least 1, at most ``cap``) until ``clock_seconds`` of sandbox time have passed:
    what a ``retry-after`` asks for."""
    wait = max(1, math.ceil(max(clock_seconds, 0.0) / scale))
    return wait if cap is None else min(cap, wait)


class LoadBook:
    """The enqueued load per (provider, account, model) and its history (callers hold the state lock)."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        """Forget all load, history and create times."""
        self.totals: dict[tuple[str, str, str], Load] = {}
        self.holds: dict[str, list[tuple[str, str, str, Load]]] = {}  # "provider|batch" -> what it holds
        self.events: list[dict[str, Any]] = []  # as recorded, with deltas; totals are rebuilt in time order
        self.creates: dict[str, deque[float]] = {}  # "provider|account" -> create times of the rolling hour

    # reading ---------------------------------------------------------------------------------------------------
    def enqueued(self, provider: str, account: str, model: str | None = None) -> Load:
        """The load held now for one model of an account, or for all its models (``model`` None)."""
        total = Load()
        for (p, a, m), load in self.totals.items():
            if p == provider and a == account and (model is None or m == model):
                total = total + load
        return total

    def holding(self, provider: str, batch_id: str) -> bool:
        """True while the batch holds load."""
        return f"{provider}|{batch_id}" in self.holds

    # changes ---------------------------------------------------------------------------------------------------
    def hold(self, provider: str, batch_id: str, account: str, loads: dict[str, Load], at: float) -> None:
        """The batch is admitted: its load per model counts from ``at``."""
        held = []
        for model, load in loads.items():
            key = (provider, account, model)
            self.totals[key] = self.totals.get(key, Load()) + load
            held.append((provider, account, model, load))
            self._event(at, key, load, "enqueue", batch_id)
        self.holds[f"{provider}|{batch_id}"] = held

    def release(self, provider: str, batch_id: str, at: float) -> None:
        """The batch no longer counts (ended, cancelled, stopped, deleted); a no-op when it holds nothing."""
        for p, account, model, load in self.holds.pop(f"{provider}|{batch_id}", []):
            key = (p, account, model)
            left = self.totals.get(key, Load()) - load
            if left == Load():
                self.totals.pop(key, None)
            else:
                self.totals[key] = left
            self._event(at, key, Load() - load, "release", batch_id)

    def refuse(self, provider: str, batch_id: str, account: str, models: list[str], at: float) -> None:
        """A quota refused the batch (or its create): recorded, never held."""
        for model in models or [""]:
            self._event(at, (provider, account, model), Load(), "refuse", batch_id)

    def _event(self, at: float, key: tuple[str, str, str], delta: Load, kind: str, batch_id: str) -> None:
        self.events.append(
            {
                "t": at,
                "provider": key[0],
                "account": key[1],
                "model": key[2],
                "event": kind,
                "batch_id": batch_id,
                "delta": asdict(delta),
            }
        )

    def creates_within_hour(self, provider: str, account: str, now: float) -> list[float]:
        """The create times of the past rolling hour, oldest first (older ones are dropped)."""
        times = self.creates.setdefault(f"{provider}|{account}", deque())
        while times and times[0] <= now - HOUR_S:
            times.popleft()
        return list(times)

    def note_create(self, provider: str, account: str, at: float) -> None:
        """Count a batch create against the rolling hour (the clock only moves forward: times stay sorted)."""
        self.creates_within_hour(provider, account, at)
        self.creates[f"{provider}|{account}"].append(at)

    # the ledger ------------------------------------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        """``{"events", "peak", "refusals"}``: events in clock order, each with the key's totals right after it;
        ``peak`` the most each key ever held."""
        running: dict[tuple[str, str, str], Load] = {}
        peaks: dict[tuple[str, str, str], dict[str, int]] = {}
        out = []
        for event in sorted(self.events, key=lambda e: e["t"]):  # stable: ties keep the order recorded
            key = (event["provider"], event["account"], event["model"])
            total = running.get(key, Load()) + Load(**event["delta"])
            running[key] = total
            peak = peaks.setdefault(key, {"tokens": 0, "requests": 0, "jobs": 0})
            for name, value in asdict(total).items():
                peak[name] = max(peak[name], value)
            out.append(
                {
                    "t": event["t"],
                    "provider": key[0],
                    "account": key[1],
                    "model": key[2],
                    **asdict(total),
                    "event": event["event"],
                    "batch_id": event["batch_id"],
                }
            )
        return {
            "events": out,
            "peak": [{"provider": k[0], "account": k[1], "model": k[2], **v} for k, v in peaks.items()],
            "refusals": sum(1 for e in self.events if e["event"] == "refuse"),
        }

    # persistence -----------------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """Plain JSON for the state directory."""
        return {
            "holds": {k: [[p, a, m, asdict(load)] for p, a, m, load in v] for k, v in self.holds.items()},
            "events": self.events,
            "creates": {k: list(v) for k, v in self.creates.items()},
        }

    def load(self, saved: dict[str, Any] | None) -> None:
        """Restore what ``to_json`` wrote."""
        self.clear()
        saved = saved or {}
        self.events = list(saved.get("events", []))
        self.creates = {k: deque(v) for k, v in saved.get("creates", {}).items()}
        for batch, held in saved.get("holds", {}).items():
            self.holds[batch] = [(p, a, m, Load(**load)) for p, a, m, load in held]
            for p, a, m, load in self.holds[batch]:
                self.totals[(p, a, m)] = self.totals.get((p, a, m), Load()) + load
