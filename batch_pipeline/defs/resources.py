"""Dagster resources: where the store lives and where prices come from (thin wrappers over core)."""

import dagster as dg

from batch_pipeline.core.pricing.cost import PriceTable, load_prices
from batch_pipeline.core.settings import PROJECT_ROOT, Settings
from batch_pipeline.core.store import Store


class StoreResource(dg.ConfigurableResource):
    """The storage root: a local directory or s3://bucket/prefix (BATCH_PIPELINE_HOME)."""

    root: str = "./.batch_pipeline"

    def get(self) -> Store:
        return Store(self.root)


class PricesResource(dg.ConfigurableResource):
    path: str = str(PROJECT_ROOT / "data" / "prices.yaml")

    def get(self) -> PriceTable:
        return load_prices(self.path)


def default_resources() -> dict:
    settings = Settings.from_env()
    return {"store": StoreResource(root=settings.home), "prices": PricesResource(path=str(settings.prices))}
