"""Dagster resources: where the store lives and where prices come from (thin wrappers over core)."""

import dagster as dg

from batch_pipeline.core.pricing.cost import PriceTable, load_prices
from batch_pipeline.core.settings import PROJECT_ROOT, Settings, lease_ttl_of
from batch_pipeline.core.store import Store


class StoreResource(dg.ConfigurableResource):
    """The storage root: a local directory or s3://bucket/prefix (BATCH_PIPELINE_HOME), and the ttl of the leases
    and capacity holds written there (BATCH_PIPELINE_LEASE_TTL_S; unset: 15 minutes)."""

    root: str = "./.batch_pipeline"
    lease_ttl_s: float | None = None

    def get(self) -> Store:
        return Store(self.root, lease_ttl=lease_ttl_of(self.lease_ttl_s))


class PricesResource(dg.ConfigurableResource):
    path: str = str(PROJECT_ROOT / "data" / "prices.yaml")

    def get(self) -> PriceTable:
        return load_prices(self.path)


def resources_of(settings: Settings) -> dict:
    """The store and prices resources the settings name (what a run of the code location or the CLI uses)."""
    store = StoreResource(root=settings.home, lease_ttl_s=settings.lease_ttl_s)
    return {"store": store, "prices": PricesResource(path=str(settings.prices))}
