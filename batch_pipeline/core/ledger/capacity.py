"""The capacity ledger: how much of one provider account's queue the jobs on this home hold, and who holds it.

One ledger per scope (provider, account, model), under ``capacity/`` of the storage root, so every job on the
same home shares it. It is a numbered log of immutable records, decided by conditional writes (no server, the
same primitive as the shard leases):

- ``r-00000042.json``: a reservation (job, shard, attempt, tokens, requests, one job), written *exclusively* at
  the next number after the highest one its writer saw, and only when it fits beside every live reservation. Two
  writers that race for a number: one wins, the other lists again and decides again, so the cap is never passed.
- ``r-00000042.bound.json``: the provider accepted the batch (its ID); a bound reservation lives until the batch
  ends.
- ``r-00000042.released.json``: the batch ended (completed, failed, expired, cancelled), the attempt was closed
  with nothing sent, or the reservation was found dead.

A reservation that was never bound expires by the lease rule (``hold_ttl``): a SIGKILL between the reservation
and the create holds no capacity forever; the job's own next run settles it at once (its intent is resolved:
re-attached and bound, or closed and released). A reservation whose attempt is closed is released by whoever
sees it next.

The limit in force per dimension is the configured one (``backend.settings.quota``) or, when the provider
refused, the one it stated, else the load in flight at the refusal; a learned-from-load limit rises again by
``RISE`` after each clean submission (``learned.json``).
"""

import logging
import re
import time
from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from batch_pipeline.core.ledger.capacity_records import (
    QUOTA_FIELDS,
    ROOT,
    CapacityScope,
    Dimension,
    Holding,
    Limits,
    Need,
    Snapshot,
)
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.spec.quota import QuotaSpec
from batch_pipeline.core.store import Store

log = logging.getLogger(__name__)

DEFAULT_HOLD_TTL = timedelta(minutes=15)
INTENT_GRACE = timedelta(minutes=2)  # a reservation is followed by its intent within moments
RISE = 1.05  # a limit learned from the load rises this much per clean submission
MAX_RACES = 50


def _parse_time(value: object) -> datetime | None:
    try:
        return datetime.fromisoformat(str(value))
    except ValueError:
        return None


class CapacityLedger:
    def __init__(
        self, store: Store, scope: CapacityScope, quota: QuotaSpec | None = None, hold_ttl: timedelta = DEFAULT_HOLD_TTL
    ):
        self.store, self.scope, self.quota, self.hold_ttl = store, scope, quota or QuotaSpec(), hold_ttl
        self.dir = f"{scope.rel}/held"

    # -- reading ---------------------------------------------------------------------------------------------
    def _rel(self, number: int, suffix: str = "") -> str:
        return f"{self.dir}/r-{number:08d}{suffix}.json"

    def _listing(self) -> tuple[int, set[int], set[int], set[int]]:
        """(highest number, reservations, bound ones, released ones)."""
        made: set[int] = set()
        bound: set[int] = set()
        released: set[int] = set()
        for rel in self.store.list_files(self.dir, suffix=".json"):
            name = rel.rsplit("/", 1)[1]
            if not name.startswith("r-"):
                continue
            stem, _, rest = name[2:].partition(".")
            if not stem.isdigit():
                continue
            {"json": made, "bound.json": bound, "released.json": released}.get(rest, set()).add(int(stem))
        return max(made, default=0), made, bound, released

    def _holding(self, number: int, bound: bool) -> Holding | None:
        record = None
        for _ in range(50):  # created, then written: a record being written reads empty for an instant; wait for it
            try:
                record = self.store.read_json(self._rel(number))
            except ValueError:
                record = None
            if isinstance(record, dict) and "job" in record:
                break
            time.sleep(0.01)
        if not isinstance(record, dict) or "job" not in record:
            return None  # torn for half a second: its writer died between create and write
        at = _parse_time(record.get("at")) or datetime.now(UTC)
        holding = Holding(
            number,
            record["job"],
            record["shard_id"],
            int(record["attempt"]),
            Need(int(record.get("tokens", 0)), int(record.get("requests", 0)), int(record.get("jobs", 1))),
            at,
        )
        if bound:
            b = self.store.read_json(self._rel(number, ".bound")) or {}
            holding = replace(holding, batch_id=b.get("batch_id"), bound_at=_parse_time(b.get("at")))
        return holding

    def _dead(self, h: Holding, now: datetime) -> str | None:
        """Why a live-looking reservation holds nothing any more, or None."""
        paths = JobPaths(h.job)
        for event in ("collected", "abandoned"):
            if self.store.exists(paths.attempt_event(h.shard_id, h.attempt, event)):
                return f"attempt {h.attempt} of shard {h.shard_id} is {event}"
        if h.batch_id is None:
            if self.store.exists(paths.attempt_event(h.shard_id, h.attempt, "submitted")):
                return None  # accepted and recorded; the bind was interrupted: it holds until the batch ends
            if now - h.at > self.hold_ttl:
                return f"never bound to a batch within {self.hold_ttl}"
            if now - h.at > INTENT_GRACE and not self.store.exists(
                paths.attempt_event(h.shard_id, h.attempt, "intent")
            ):
                return "no intent followed it"
        return None

    def limits(self) -> Limits:
        values: dict[Dimension, int] = {}
        sources: dict[Dimension, str] = {}
        for dim, name in QUOTA_FIELDS.items():
            configured = getattr(self.quota, name)
            if configured is not None:
                values[dim], sources[dim] = int(configured), "configured"
        for dim, entry in self.learned().items():
            admitted = int(entry.get("admitted", 0))
            if admitted > 0 and (dim not in values or admitted < values[dim]):
                values[dim], sources[dim] = admitted, f"learned ({entry.get('source')})"
        return Limits(values, sources)

    def learned(self) -> dict[Dimension, dict]:
        raw = self.store.read_json(f"{self.scope.rel}/learned.json") or {}
        return {Dimension(k): v for k, v in raw.items() if k in Dimension.__members__.values()}

    def snapshot(self, sweep: bool = True) -> Snapshot:
        """Every live reservation (dead ones are released on the way when ``sweep``) and the limits in force."""
        now = datetime.now(UTC)
        _, made, bound, released = self._listing()
        live: list[Holding] = []
        for number in sorted(made - released):
            h = self._holding(number, number in bound)
            if h is None:
                continue
            why = self._dead(h, now) if sweep else None
            if why is not None:
                self.release(number, why)
                continue
            live.append(h)
        limits = self.limits()
        per_hour = self._created_since(now - timedelta(hours=1), bound) if Dimension.PER_HOUR in limits.values else 0
        return Snapshot(self.scope, limits, tuple(live), per_hour)

    def _created_since(self, since: datetime, bound: set[int]) -> int:
        count = 0
        for number in sorted(bound, reverse=True):
            at = _parse_time((self.store.read_json(self._rel(number, ".bound")) or {}).get("at"))
            if at is None or at < since:
                break
            count += 1
        return count

    # -- writing ---------------------------------------------------------------------------------------------
    def reserve(self, job: str, shard_id: str, attempt: int, need: Need, *, force: bool = False) -> Holding | None:
        """Hold ``need`` for one attempt if it fits (always with ``force``: a batch already at the provider);
        None when it does not fit now."""
        for _ in range(MAX_RACES):
            top, *_ = self._listing()
            snap = self.snapshot()
            if not force and not snap.fits(need):
                return None
            now = datetime.now(UTC)
            record = {
                "job": job,
                "shard_id": shard_id,
                "attempt": attempt,
                "tokens": need.tokens,
                "requests": need.requests,
                "jobs": need.jobs,
                "at": now.isoformat(),
                "forced": force,
            }
            if self.store.create_json_exclusive(self._rel(top + 1), record):
                return Holding(top + 1, job, shard_id, attempt, need, now)
        raise RuntimeError(f"capacity ledger {self.scope.rel}: lost {MAX_RACES} races for a reservation number")

    def bind(self, number: int, batch_id: str) -> None:
        self.store.create_json_exclusive(
            self._rel(number, ".bound"), {"batch_id": batch_id, "at": datetime.now(UTC).isoformat()}
        )

    def release(self, number: int, why: str) -> None:
        if self.store.create_json_exclusive(
            self._rel(number, ".released"), {"why": why, "at": datetime.now(UTC).isoformat()}
        ):
            log.info("capacity %s: reservation %d released (%s)", self.scope.rel, number, why)

    def release_attempt(self, job: str, shard_id: str, attempt: int, why: str) -> None:
        """Release whatever this attempt holds (a no-op when it holds nothing)."""
        for h in self.snapshot(sweep=False).holdings:
            if (h.job, h.shard_id, h.attempt) == (job, shard_id, attempt):
                self.release(h.number, why)

    # -- learning --------------------------------------------------------------------------------------------
    def learn(self, dim: Dimension, stated: int | None, load: int, need: int = 0) -> int:
        """The provider refused a batch of ``need``: the limit it stated, else the load in flight at that moment
        (with nothing else in flight, the batch alone was too big: half of it). Returns the limit now in force."""
        learned = {k.value: v for k, v in self.learned().items()}
        admitted = stated if stated else (load if load > 0 else max(need // 2, 1))
        configured = getattr(self.quota, QUOTA_FIELDS[dim])
        if configured is not None:
            admitted = min(admitted, configured)
        learned[dim.value] = {
            "admitted": admitted,
            "stated": stated,
            "load": load,
            "source": "stated by the provider" if stated else "load at the refusal",
            "at": datetime.now(UTC).isoformat(),
        }
        self.store.write_json(f"{self.scope.rel}/learned.json", learned)
        log.warning(
            "capacity %s: the provider refused at %s %s; admitting %d from now on",
            self.scope.rel,
            load,
            dim.label,
            admitted,
        )
        return admitted

    def clean_submission(self) -> None:
        """A batch was accepted: a limit learned from the load (not stated) rises again, slowly."""
        learned = self.learned()
        rising = {d: e for d, e in learned.items() if not e.get("stated")}
        if not rising:
            return
        for dim, entry in rising.items():
            configured = getattr(self.quota, QUOTA_FIELDS[dim])
            grown = int(entry["admitted"] * RISE) + 1
            entry["admitted"] = min(grown, configured) if configured is not None else grown
        self.store.write_json(f"{self.scope.rel}/learned.json", {k.value: v for k, v in learned.items()})


_STATED = re.compile(r"limit:?\s*([\d][\d,_.]*)\s*([kKmM]?)", re.IGNORECASE)


def stated_limit(message: str) -> int | None:
    """The limit a provider's refusal states ("... Limit: 2,000,000 enqueued tokens ..."), or None."""
    match = _STATED.search(message or "")
    if not match:
        return None
    digits = match.group(1).replace(",", "").replace("_", "").rstrip(".")
    try:
        value = float(digits)
    except ValueError:
        return None
    scale = {"k": 1_000, "m": 1_000_000}.get(match.group(2).lower(), 1)
    return int(value * scale) or None


def scopes_in_use(store: Store) -> Iterable[str]:
    """Every scope that has a ledger on this home (for ``status --all`` and the docs' troubleshooting)."""
    return store.list_files(ROOT, recursive=True, suffix="learned.json")
