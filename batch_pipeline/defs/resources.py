"""Dagster resources: where the store lives and where prices come from (thin wrappers over core)."""

import os
from pathlib import Path

import dagster as dg

from batch_pipeline.core.cost import PriceTable, load_prices
from batch_pipeline.core.store import DEFAULT_HOME, Store

PROJECT_ROOT = Path(__file__).resolve().parents[2]


class StoreResource(dg.ConfigurableResource):
    """The storage root: a local directory or s3://bucket/prefix (BATCH_PIPELINE_HOME)."""

    root: str = DEFAULT_HOME

    def get(self) -> Store:
        return Store(self.root)


class PricesResource(dg.ConfigurableResource):
    path: str = str(PROJECT_ROOT / "data" / "prices.yaml")

    def get(self) -> PriceTable:
        return load_prices(self.path)


def default_resources() -> dict:
    return {
        "store": StoreResource(root=os.environ.get("BATCH_PIPELINE_HOME", str(PROJECT_ROOT / ".batch_pipeline"))),
        "prices": PricesResource(path=os.environ.get("BATCH_PIPELINE_PRICES", str(PROJECT_ROOT / "data" / "prices.yaml"))),
    }
