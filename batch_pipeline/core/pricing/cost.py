"""Token estimates and prices: the quote is a plan priced before any spend.

The manifest stores a cheap per-item estimate (UTF-8 bytes / 4 plus per-message framing: ``est_input_tokens``),
which sizes shards and bounds the budget. The quote rescales it with the model family's tokenizer
(``core/pricing/tokenizers.py``, ``core/money/estimate.py``) and calibrates that on measured usage.
"""

import math
import os
from datetime import date
from functools import lru_cache
from pathlib import Path
from typing import Literal

import polars as pl
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from batch_pipeline.core.errors import ConfigError

BYTES_PER_TOKEN = 4.0
MESSAGE_OVERHEAD_TOKENS = 4  # role and separators per message
REQUEST_OVERHEAD_TOKENS = 3  # reply priming


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text.encode()) / BYTES_PER_TOKEN)


def fixed_request_tokens(system_bytes: int) -> int:
    """The part of ``estimate_request_tokens`` that is the same for every request: system message and framing."""
    system = math.ceil(system_bytes / BYTES_PER_TOKEN) + MESSAGE_OVERHEAD_TOKENS if system_bytes else 0
    return system + MESSAGE_OVERHEAD_TOKENS + REQUEST_OVERHEAD_TOKENS


def estimate_request_tokens(user_bytes: pl.Expr, system_bytes: int) -> pl.Expr:
    """Input tokens of one chat request (system + user message), vectorised."""
    return (user_bytes / BYTES_PER_TOKEN).ceil() + fixed_request_tokens(system_bytes)


# Anthropic's published cache-write multipliers of the input rate, per TTL of the cache_control block
CACHE_WRITE_MULTIPLIERS = {"5m": 1.25, "1h": 2.0}


class Price(BaseModel):
    """USD per million tokens of one model on one backend.

    Input is billed in three parts: uncached input at ``input_per_mtok``, cache reads at
    ``cached_input_per_mtok``, and cache writes at ``input_per_mtok * cache_write_multiplier``. A provider
    whose cache is written explicitly and billed for it (Anthropic: ``cache_control`` blocks) names the TTL its
    requests ask for in ``cache_ttl``; the multiplier defaults to that TTL's published one (5m: 1.25, 1h: 2.0),
    else 1.25. Providers with automatic caching (OpenAI) write nothing billable: no ``cache_ttl``, and their
    results carry no cache-write tokens.
    """

    model_config = ConfigDict(extra="forbid")
    input_per_mtok: float = Field(ge=0)
    cached_input_per_mtok: float | None = Field(default=None, ge=0)
    output_per_mtok: float = Field(ge=0)
    batch_discount: float = Field(default=0.0, ge=0, lt=1, description="share taken off on the batch API")
    cache_ttl: Literal["5m", "1h"] | None = Field(
        default=None, description="TTL of the cache our requests write (Anthropic); None: writes are not billed apart"
    )
    cache_write_multiplier: float = Field(default=1.25, ge=1, description="cache writes cost input x this")
    checked: date

    @model_validator(mode="after")
    def _ttl_multiplier(self) -> "Price":
        if self.cache_ttl is not None and "cache_write_multiplier" not in self.model_fields_set:
            self.cache_write_multiplier = CACHE_WRITE_MULTIPLIERS[self.cache_ttl]
        return self

    @property
    def writes_cache(self) -> bool:
        """Requests write a billed cache (at the multiplier) whenever they miss it."""
        return self.cache_ttl is not None

    def cost(self, input_tokens, output_tokens, cached_tokens=0, batch: bool = True, cache_write_tokens=0):
        """The one cost formula (scalars, or NumPy arrays element-wise). ``input_tokens`` is ALL input: uncached +
        cache reads (``cached_tokens``) + cache writes (``cache_write_tokens``)."""
        cached_rate = self.cached_input_per_mtok if self.cached_input_per_mtok is not None else self.input_per_mtok
        uncached = input_tokens - cached_tokens - cache_write_tokens
        raw = (
            uncached * self.input_per_mtok
            + cache_write_tokens * (self.input_per_mtok * self.cache_write_multiplier)
            + cached_tokens * cached_rate
            + output_tokens * self.output_per_mtok
        ) / 1e6
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
    """The price table at ``path``, parsed once per version of the file (its size and mtime): every shard step
    asks for it, and a parse is ~8 ms. Callers share the table and must not change it."""
    try:
        stat = Path(path).stat()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read price table: {exc.strerror}") from None
    return _parse_prices(os.path.abspath(path), stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=16)
def _parse_prices(path: str, size: int, mtime_ns: int) -> PriceTable:
    """``size`` and ``mtime_ns`` key the cache: an edited table is parsed again."""
    try:
        data = yaml.load(Path(path).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        return PriceTable.model_validate(data)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read price table: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: the price table is not valid YAML: {exc}") from None
    except ValidationError as exc:
        raise ConfigError(f"{path}: invalid price table: {exc}") from None
