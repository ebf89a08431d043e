"""Which queue a provider batch executor's batches wait in (its capacity scope) and what that queue caps.

Mixed into every provider batch executor; each states the dimensions its provider caps (``quota_dimensions``)
and whether the cap is per model. The runner reserves capacity in the scope's ledger (core/ledger/capacity.py)
before every create; the driver reads the same ledger to say which shards wait.
"""

from datetime import timedelta
from typing import Any, ClassVar

from batch_pipeline.core.ledger.capacity import CapacityScope, Dimension
from batch_pipeline.core.ledger.ceilings import Ceilings
from batch_pipeline.core.spec.quota import QuotaSpec


def account_label(settings: Any) -> str:
    """The ledger's name of the account: ``account``, else the key's variable name, else "default"."""
    return str(getattr(settings, "account", None) or getattr(settings, "api_key_env", None) or "default")


class QueueCapped:
    """A batch executor whose account has a queue (``capacity``), configured by ``backend.settings.quota``."""

    quota_dimensions: ClassVar[tuple[Dimension, ...]] = ()
    quota_per_model: ClassVar[bool] = True
    window_hours: ClassVar[float | None] = 24.0  # the provider ends an open batch this long after its creation
    retention_days: ClassVar[float | None] = None  # it deletes the results this long after ``retention_from``
    retention_from: ClassVar[str] = "completed"
    settings: Any

    @classmethod
    def ceilings(cls, settings: Any) -> Ceilings:
        window = getattr(settings, "completion_window", None) or getattr(settings, "timeout_hours", None)
        hours = cls.window_hours
        if isinstance(window, str) and window.endswith("h") and window[:-1].replace(".", "").isdigit():
            hours = float(window[:-1])
        elif isinstance(window, int | float):
            hours = float(window)
        return Ceilings(
            str(cls.name),
            timedelta(hours=hours) if hours else None,
            timedelta(days=cls.retention_days) if cls.retention_days else None,
            cls.retention_from,
        )

    @classmethod
    def scope_for(cls, settings: Any, model: str) -> CapacityScope:
        return CapacityScope(str(cls.name), account_label(settings), model if cls.quota_per_model else "*")

    def capacities(self, model: str) -> list[tuple[str | None, CapacityScope, QuotaSpec]]:
        """(account name for ``ShardWork.account``, scope, quota) of each account: one here (executors/accounts.py
        spreads several)."""
        return [(None, self.scope_for(self.settings, model), self.settings.quota)]
