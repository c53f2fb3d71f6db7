"""A dated price table (dollars per million tokens) and the savings that prompt caching earned under it.

Cost model, per model, over a time range:

    without cache = prompt_tokens * input
    with cache    = cached_tokens * cached_input + (prompt_tokens - cached_tokens) * cache_write

`cache_write` equals `input` for providers that do not charge for writing the cache. Models missing from the table are
priced with the `"*"` row when there is one, else left unpriced (and listed as such).
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

FALLBACK_MODEL = "*"
TOKENS_PER_PRICE_UNIT = 1_000_000


class PriceTableError(ValueError):
    """A price file or an edited table is malformed."""


@dataclass(frozen=True)
class ModelPrice:
    """Dollars per million prompt tokens."""

    input_per_mtok: float
    cached_input_per_mtok: float
    cache_write_per_mtok: float


@dataclass(frozen=True)
class PriceTable:
    as_of: date
    source: str
    prices: Mapping[str, ModelPrice]

    def price_for(self, model: str) -> tuple[ModelPrice | None, str | None]:
        """The price row for `model` and the row's name (the model itself or the fallback)."""
        if model in self.prices:
            return self.prices[model], model
        if FALLBACK_MODEL in self.prices:
            return self.prices[FALLBACK_MODEL], FALLBACK_MODEL
        return None, None


DEFAULT_PRICE_TABLE = PriceTable(
    as_of=date(2025, 6, 1),
    source="providers' public list prices (standard tier, 5-minute cache writes); check before relying on them",
    prices={
        "gpt-4o": ModelPrice(2.50, 1.25, 2.50),
        "gpt-4o-mini": ModelPrice(0.15, 0.075, 0.15),
        "gpt-4.1": ModelPrice(2.00, 0.50, 2.00),
        "gpt-4.1-mini": ModelPrice(0.40, 0.10, 0.40),
        "claude-sonnet-4": ModelPrice(3.00, 0.30, 3.75),
        "claude-3-5-haiku": ModelPrice(0.80, 0.08, 1.00),
        # Self-hosted models have no list price; this row stands for "what a hosted API would have charged".
        FALLBACK_MODEL: ModelPrice(0.15, 0.075, 0.15),
    },
)


def _price_from_mapping(model: str, row: Mapping[str, Any]) -> ModelPrice:
    try:
        input_price = float(row["input"])
        cached = float(row["cached_input"])
        write = float(row.get("cache_write", input_price))
    except (KeyError, TypeError, ValueError) as exc:
        raise PriceTableError(
            f"model {model!r}: needs numeric 'input' and 'cached_input' (and optional 'cache_write')"
        ) from exc
    if min(input_price, cached, write) < 0:
        raise PriceTableError(f"model {model!r}: prices must not be negative")
    return ModelPrice(input_price, cached, write)


def price_table_from_dict(data: Mapping[str, Any]) -> PriceTable:
    """Parse `{"as_of": "YYYY-MM-DD", "source": "...", "models": {name: {"input", "cached_input", "cache_write"}}}`."""
    raw_date = data.get("as_of")
    if isinstance(raw_date, date):
        as_of = raw_date
    else:
        try:
            as_of = date.fromisoformat(str(raw_date))
        except ValueError as exc:
            raise PriceTableError(f"'as_of' must be a YYYY-MM-DD date, got {raw_date!r}") from exc
    models = data.get("models")
    if not isinstance(models, Mapping) or not models:
        raise PriceTableError("'models' must be a non-empty table of model name -> prices")
    prices = {str(name): _price_from_mapping(str(name), row) for name, row in models.items()}
    return PriceTable(as_of=as_of, source=str(data.get("source", "")), prices=prices)


def price_table_to_dict(table: PriceTable) -> dict[str, Any]:
    return {
        "as_of": table.as_of.isoformat(),
        "source": table.source,
        "models": {
            name: {
                "input": p.input_per_mtok,
                "cached_input": p.cached_input_per_mtok,
                "cache_write": p.cache_write_per_mtok,
            }
            for name, p in table.prices.items()
        },
    }


def load_price_table(path: Path) -> PriceTable:
    """Read a price table from a `.toml` or `.json` file."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PriceTableError(f"cannot read price file {path}: {exc}") from exc
    try:
        data = tomllib.loads(text) if path.suffix.lower() == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise PriceTableError(f"price file {path} is not valid {path.suffix.lstrip('.') or 'JSON'}: {exc}") from exc
    return price_table_from_dict(data)


def price_rows(table: PriceTable) -> list[dict[str, Any]]:
    """The table as editable rows (model, input, cached_input, cache_write)."""
    return [
        {
            "model": name,
            "input": p.input_per_mtok,
            "cached_input": p.cached_input_per_mtok,
            "cache_write": p.cache_write_per_mtok,
        }
        for name, p in table.prices.items()
    ]


def price_table_from_rows(rows: Iterable[Mapping[str, Any]], as_of: date, source: str) -> PriceTable:
    """Inverse of `price_rows`, skipping rows without a model name (new, half-filled editor rows)."""
    models: dict[str, Any] = {}
    for row in rows:
        name = str(row.get("model") or "").strip()
        if name:
            models[name] = row
    return price_table_from_dict({"as_of": as_of.isoformat(), "source": source, "models": models})


@dataclass(frozen=True)
class ModelUsage:
    model: str
    prompt_tokens: int
    cached_tokens: int


@dataclass(frozen=True)
class ModelSavings:
    model: str
    priced_as: str | None
    prompt_tokens: int
    cached_tokens: int
    cost_without_cache_usd: float | None
    cost_with_cache_usd: float | None

    @property
    def saved_usd(self) -> float | None:
        if self.cost_without_cache_usd is None or self.cost_with_cache_usd is None:
            return None
        return self.cost_without_cache_usd - self.cost_with_cache_usd


def compute_savings(usage: Iterable[ModelUsage], table: PriceTable) -> list[ModelSavings]:
    """Dollars with and without the cache for each model, under `table` (see the module docstring)."""
    results = []
    for item in usage:
        price, priced_as = table.price_for(item.model)
        if price is None:
            results.append(ModelSavings(item.model, None, item.prompt_tokens, item.cached_tokens, None, None))
            continue
        uncached = max(item.prompt_tokens - item.cached_tokens, 0)
        without = item.prompt_tokens * price.input_per_mtok / TOKENS_PER_PRICE_UNIT
        with_cache = (
            item.cached_tokens * price.cached_input_per_mtok + uncached * price.cache_write_per_mtok
        ) / TOKENS_PER_PRICE_UNIT
        results.append(ModelSavings(item.model, priced_as, item.prompt_tokens, item.cached_tokens, without, with_cache))
    return results
