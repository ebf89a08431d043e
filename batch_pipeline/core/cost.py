"""Token estimates and prices: the quote is a plan priced before any spend.

Token counts are a calibrated estimate (UTF-8 bytes / 4 plus per-message framing) until a later
issue adds the model's own tokenizer where one is available locally.
"""

import math
from datetime import date
from pathlib import Path

import polars as pl
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from batch_pipeline.core.errors import ConfigError

BYTES_PER_TOKEN = 4.0
MESSAGE_OVERHEAD_TOKENS = 4  # role and separators per message
REQUEST_OVERHEAD_TOKENS = 3  # reply priming


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text.encode()) / BYTES_PER_TOKEN)


def estimate_request_tokens(user_bytes: pl.Expr, system_bytes: int) -> pl.Expr:
    """Input tokens of one chat request (system + user message), vectorised."""
    system = math.ceil(system_bytes / BYTES_PER_TOKEN) + MESSAGE_OVERHEAD_TOKENS if system_bytes else 0
    return (user_bytes / BYTES_PER_TOKEN).ceil() + (system + MESSAGE_OVERHEAD_TOKENS + REQUEST_OVERHEAD_TOKENS)


class Price(BaseModel):
    model_config = ConfigDict(extra="forbid")
    input_per_mtok: float = Field(ge=0)
    cached_input_per_mtok: float | None = Field(default=None, ge=0)
    output_per_mtok: float = Field(ge=0)
    batch_discount: float = Field(default=0.0, ge=0, lt=1, description="share taken off on the batch API")
    checked: date

    def cost(self, input_tokens: float, output_tokens: float, cached_tokens: float = 0, batch: bool = True) -> float:
        cached_rate = self.cached_input_per_mtok if self.cached_input_per_mtok is not None else self.input_per_mtok
        raw = ((input_tokens - cached_tokens) * self.input_per_mtok + cached_tokens * cached_rate
               + output_tokens * self.output_per_mtok) / 1e6
        return raw * (1 - self.batch_discount) if batch else raw


class PriceTable(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prices: dict[str, dict[str, Price]] = Field(description="backend -> model -> price")

    def lookup(self, backend: str, model: str) -> Price:
        try:
            return self.prices[backend][model]
        except KeyError:
            known = sorted(self.prices.get(backend, {}))
            raise ConfigError(
                f"no price for model {model!r} on backend {backend!r} in the price table "
                f"(known for {backend}: {known or 'none'}); add it to data/prices.yaml"
            ) from None


def load_prices(path: str | Path) -> PriceTable:
    try:
        data = yaml.safe_load(Path(path).read_text())
        return PriceTable.model_validate(data)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read price table: {exc.strerror}") from None
    except ValidationError as exc:
        raise ConfigError(f"{path}: invalid price table: {exc}") from None
