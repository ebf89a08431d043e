"""Several accounts of one provider behind one backend (``backend.settings.accounts``).

Each account is the provider's own executor with that account's key and quota; admission (core/run/admission.py)
picks, per attempt, the account whose queue has room and names it in ``ShardWork.account``. The batch's handle
names its account, so polling, downloading, cancelling and deleting go to the account that holds the batch, and
``find`` after a crash asks every account.
"""

import logging
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import pyarrow as pa

from batch_pipeline.core.errors import ConfigError
from batch_pipeline.core.ledger.capacity import CapacityScope
from batch_pipeline.core.ledger.executor import BatchHandle, BatchStatus, ShardWork
from batch_pipeline.core.spec.quota import QuotaSpec

log = logging.getLogger(__name__)


class AccountSpread:
    """One provider batch backend spread over its accounts; each account keeps its own ledger and re-attach."""

    def __init__(self, cls: type[Any], settings: Any):
        if len({a.label for a in settings.accounts}) != len(settings.accounts):
            raise ConfigError(
                f"backend.settings.accounts of {cls.name}: two accounts have the same name "
                "(give each a distinct `name` or `api_key_env`)"
            )
        self.cls, self.settings = cls, settings
        self.accounts: dict[str, Any] = {}
        for account in settings.accounts:
            own = settings.model_copy(
                update={
                    "api_key_env": account.api_key_env,
                    "account": account.label,
                    "quota": account.quota,
                    "accounts": [],
                }
            )
            self.accounts[account.label] = cls(own)
        self.first = next(iter(self.accounts.values()))
        self.name = cls.name
        self.quota_dimensions = cls.quota_dimensions

    def __getattr__(self, attr: str) -> Any:  # limits, pricing, poll interval, grace: the same for every account
        if attr in ("accounts", "first", "cls"):
            raise AttributeError(attr)
        return getattr(self.first, attr)

    def capacities(self, model: str) -> list[tuple[str | None, CapacityScope, QuotaSpec]]:
        return [(label, ex.scope_for(ex.settings, model), ex.settings.quota) for label, ex in self.accounts.items()]

    def _of(self, account: str | None) -> Any:
        if account is None:
            return self.first
        try:
            return self.accounts[account]
        except KeyError:
            raise ConfigError(
                f"backend {self.name}: a batch of account {account!r} is open, but the spec's accounts "
                f"are {sorted(self.accounts)}; put it back until its batches are collected"
            ) from None

    def submit(self, work: ShardWork) -> BatchHandle:
        return replace(self._of(work.account).submit(work), account=work.account or next(iter(self.accounts)))

    def poll(self, handle: BatchHandle) -> BatchStatus:
        return self._of(handle.account).poll(handle)

    def fetch(self, handle: BatchHandle) -> Iterator[pa.Table]:
        return self._of(handle.account).fetch(handle)

    def cancel(self, handle: BatchHandle) -> None:
        self._of(handle.account).cancel(handle)

    def discard(self, handle: BatchHandle) -> list[str]:
        executor = self._of(handle.account)
        return executor.discard(handle) if hasattr(executor, "discard") else []

    def find(
        self, key: str, request_ids: Sequence[str] | None = None, not_before: str | None = None
    ) -> BatchHandle | None:
        for label, executor in self.accounts.items():
            found = executor.find(key, request_ids=request_ids, not_before=not_before)
            if found is not None:
                return replace(found, account=label)
        return None
