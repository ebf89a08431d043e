"""Shard leases with fencing tokens: two concurrent materializations of one shard never both submit.

A lease is an immutable record ``leases/<shard>/lease-<token>.json`` created exclusively; the highest
token is the current lease. Taking over an expired or released lease means creating the next token,
which exactly one contender can do. Every attempt records the token it ran under; an attempt whose
token is no longer the highest is stale and may not mark the shard done (``StaleAttemptError``).
"""

import logging
import os
import socket
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from batch_pipeline.core.errors import BatchPipelineError, StaleAttemptError
from batch_pipeline.core.paths import JobPaths
from batch_pipeline.core.store import Store

log = logging.getLogger(__name__)
DEFAULT_TTL = timedelta(minutes=15)


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

    def _rel(self, token: int, suffix: str = "") -> str:
        return f"{JobPaths(self.job).root}/leases/{self.shard_id}/lease-{token:06d}{suffix}.json"

    def is_current(self) -> bool:
        return current_token(self.store, self.job, self.shard_id) == self.token and not self.store.exists(
            self._rel(self.token, ".released"))

    def check(self, action: str) -> None:
        """Fence: raise unless this lease is still the shard's current one."""
        if not self.is_current():
            raise StaleAttemptError(f"shard {self.shard_id}: lease token {self.token} of {self.owner} is stale; "
                                    f"refusing to {action}")

    def renew(self) -> None:
        self.check("renew the lease")
        self.store.write_json(self._rel(self.token), _record(self.owner, self.ttl))

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
    files = store.list_files(f"{JobPaths(job).root}/leases/{shard_id}", suffix=".json")
    tokens = [int(f.rsplit("lease-", 1)[1][:6]) for f in files if f.rsplit("/", 1)[1].startswith("lease-")]
    return max(tokens, default=0)


def acquire(store: Store, job: str, shard_id: str, owner: str | None = None, ttl: timedelta = DEFAULT_TTL) -> Lease:
    """Take the shard's lease, or raise ``LeaseHeldError`` naming the holder and until when."""
    owner = owner or default_owner()
    token = current_token(store, job, shard_id)
    probe = Lease(store, job, shard_id, owner, token, ttl)
    if token:
        record = store.read_json(probe._rel(token)) or {}
        released = store.exists(probe._rel(token, ".released"))
        expires = datetime.fromisoformat(record["expires_at"]) if "expires_at" in record else None
        if not released and expires is not None and expires > datetime.now(UTC) and _holder_alive(record):
            raise LeaseHeldError(f"shard {shard_id} is leased by {record.get('owner')} until {expires.isoformat()}")
        if not released:
            log.warning("shard %s: lease %d of %s expired at %s; taking over", shard_id, token,
                        record.get("owner"), record.get("expires_at"))
    nxt = Lease(store, job, shard_id, owner, token + 1, ttl)
    if not store.create_json_exclusive(nxt._rel(token + 1), _record(owner, ttl)):
        raise LeaseHeldError(f"shard {shard_id}: another run took the lease at the same moment")
    return nxt
