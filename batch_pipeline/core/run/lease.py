"""Shard leases with fencing tokens: two concurrent materializations of one shard never both submit.

A lease is an immutable record ``leases/<shard>/lease-<token>.json`` created exclusively; the highest
token is the current lease. Taking over an expired or released lease means creating the next token,
which exactly one contender can do. Every attempt records the token it ran under; an attempt whose
token is no longer the highest is stale and may not mark the shard done (``StaleAttemptError``).

Fencing: every write of an outcome (an intent, a result part, a ``collected`` record) is preceded by
``Lease.check``, so an attempt that lost its lease (it stalled past its ttl and another run took over) writes
nothing more. The check is a listing of the shard's lease directory plus one existence check, so a write that
lands in the instant between the check and a takeover is the only window left (a takeover needs the ttl to pass
without a renewal, or the holder's process to be gone). Holders renew every ttl/3 (``Lease.heartbeat``).

The ttl is the store's (``Store.lease_ttl``: 15 minutes unless ``$BATCH_PIPELINE_LEASE_TTL_S`` says otherwise).
"""

import json
import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from batch_pipeline.core.errors import BatchPipelineError, StaleAttemptError
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store

log = logging.getLogger(__name__)


class LeaseHeldError(BatchPipelineError):
    """Another run holds the shard; this run must not touch it now (retry later)."""

    retryable = True


def default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass
class Lease:
    store: Store
    job: str
    shard_id: str
    owner: str
    token: int
    ttl: timedelta
    renewed_at: float = field(default_factory=time.monotonic, compare=False)  # monotonic time of the last write

    def _rel(self, token: int, suffix: str = "") -> str:
        return f"{JobPaths(self.job).root}/leases/{self.shard_id}/lease-{token:06d}{suffix}.json"

    def is_current(self) -> bool:
        return current_token(self.store, self.job, self.shard_id) == self.token and not self.store.exists(
            self._rel(self.token, ".released")
        )

    def check(self, action: str) -> None:
        """Fence: raise unless this lease is still the shard's current one."""
        if not self.is_current():
            raise StaleAttemptError(
                f"shard {self.shard_id}: lease token {self.token} of {self.owner} is stale; refusing to {action}"
            )

    def renew(self) -> None:
        self.check("renew the lease")
        self.store.write_json(self._rel(self.token), _record(self.owner, self.ttl))
        self.renewed_at = time.monotonic()

    def heartbeat(self) -> bool:
        """Renew when a third of the ttl has passed since the lease was taken or last renewed (cheap otherwise:
        one clock read). True if it renewed. Raises ``StaleAttemptError`` if the lease was taken over."""
        if time.monotonic() - self.renewed_at < self.ttl.total_seconds() / 3:
            return False
        self.renew()
        return True

    def release(self) -> None:
        if self.is_current():
            self.store.write_json(self._rel(self.token, ".released"), {"owner": self.owner})

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _record(owner: str, ttl: timedelta) -> dict:
    now = datetime.now(UTC)
    return {"owner": owner, "acquired_at": now.isoformat(), "expires_at": (now + ttl).isoformat()}


def _holder_alive(record: dict) -> bool:
    """False only when the holder ran on this host and its process is gone (a crash: no need to wait)."""
    host, _, rest = str(record.get("owner", "")).partition(":")
    pid = rest.split(":", 1)[0]
    if host != socket.gethostname() or not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def current_token(store: Store, job: str, shard_id: str) -> int:
    rel = f"{JobPaths(job).root}/leases/{shard_id}"
    for n in range(3):
        try:
            files = store.list_files(rel, suffix=".json")
            break
        except FileNotFoundError:  # the directory was being created by a contender's first lease: list again
            if n == 2:
                return 0
            time.sleep(0.005)
    tokens = [int(f.rsplit("lease-", 1)[1][:6]) for f in files if f.rsplit("/", 1)[1].startswith("lease-")]
    return max(tokens, default=0)


def acquire(store: Store, job: str, shard_id: str, owner: str | None = None, ttl: timedelta | None = None) -> Lease:
    """Take the shard's lease, or raise ``LeaseHeldError`` naming the holder and until when.

    A lease is taken over when it was released, has expired, or its holder ran on this host and its process is
    gone; the new lease has the next token, and the old holder's next ``check`` raises ``StaleAttemptError``."""
    owner = owner or default_owner()
    ttl = ttl or store.lease_ttl
    token = current_token(store, job, shard_id)
    probe = Lease(store, job, shard_id, owner, token, ttl)
    if token:
        record = _read_record(store, probe._rel(token))
        released = store.exists(probe._rel(token, ".released"))
        expires = _expiry(record)
        now = datetime.now(UTC)
        alive = _holder_alive(record)
        if not released and expires is not None and expires > now and alive:
            raise _held(shard_id, record)
        if not released:
            log.warning(
                "shard %s: taking over lease %d of %s: %s",
                shard_id,
                token,
                record.get("owner", "an unknown owner"),
                _takeover_reason(record, expires, now, alive),
            )
    nxt = Lease(store, job, shard_id, owner, token + 1, ttl)
    if not store.create_json_exclusive(nxt._rel(token + 1), _record(owner, ttl)):
        raise _held(shard_id, _read_record(store, nxt._rel(token + 1)), " (taken at the same moment)")
    return nxt


def _takeover_reason(record: dict, expires: datetime | None, now: datetime, alive: bool) -> str:
    """Why a lease that was not released may be taken: its holder's process is gone, or its time is up."""
    if not alive:
        pid = str(record.get("owner", "")).split(":")[1]
        if expires is None:
            return f"its process (pid {pid} on this host) is gone"
        when = expires.isoformat(timespec="seconds")
        return f"its process (pid {pid} on this host) is gone" + (
            f"; its lease would have run until {when}" if expires > now else f"; its lease expired at {when}"
        )
    if expires is None:
        return "its lease record is unreadable (torn: its holder died while writing it)"
    ago = (now - expires).total_seconds()
    return f"its lease expired at {expires.isoformat(timespec='seconds')}, {_ago(ago)} ago, without a renewal"


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def _held(shard_id: str, record: dict, how: str = "") -> LeaseHeldError:
    return LeaseHeldError(
        f"shard {shard_id} is leased by {record.get('owner', 'another run')} until "
        f"{record.get('expires_at', 'unknown')}{how}"
    )


def _expiry(record: dict) -> datetime | None:
    try:
        return datetime.fromisoformat(record["expires_at"])
    except (KeyError, TypeError, ValueError):
        return None


def _read_record(store: Store, rel: str, tries: int = 20) -> dict:
    """The lease record at ``rel`` ({} if there is none). A record just created exclusively on local disk is empty
    for an instant (created, then written), so an unreadable one is read again for up to ~0.2 s before it counts as
    torn (its holder died between the two: it may be taken over, like an expired one)."""
    for _ in range(tries):
        try:
            record = json.loads(store.read_bytes(rel))
        except FileNotFoundError:
            return {}
        except (ValueError, UnicodeDecodeError):
            record = None
        if isinstance(record, dict) and _expiry(record) is not None:
            return record
        time.sleep(0.01)
    log.warning("lease record %s is unreadable; treating it as expired", store.uri(rel))
    return {}


class LeaseKeeper:
    """Renews a shard's lease every third of its TTL while a collection waits on the provider."""

    def __init__(self, lease: Lease):
        self.lease = lease
        self.renew_at = time.monotonic() + lease.ttl.total_seconds() / 3

    def tick(self) -> None:
        if time.monotonic() > self.renew_at:
            self.lease.renew()
            self.renew_at = time.monotonic() + self.lease.ttl.total_seconds() / 3
