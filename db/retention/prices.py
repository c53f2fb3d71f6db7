"""Cost models per upstream, from `prefixscope.toml`: each `[[upstreams]]` entry's `kind`, with optional overrides in
`[advice.cache_prices.<upstream name>]` (see `db.retention.costs.CostModel.for_kind` for the fields).

Example::

    [advice.cache_prices.claude]
    write_1h = 2.0
    read = 0.1

    [advice.cache_prices.gpt]
    read = 0.25          # gpt-4.1's cached-input price is a quarter of its input price
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from db.retention.costs import CostModel, PriceError

DEFAULT_KIND = "local_engine"


class UpstreamPrices:
    """The cost model of each upstream name; an upstream the config does not name is priced as `default_kind`."""

    def __init__(
        self, models: Mapping[str, CostModel], default_kind: str = DEFAULT_KIND, overridden: Mapping[str, Any] | None = None
    ) -> None:
        self._models = dict(models)
        self._default = CostModel.for_kind(default_kind)
        self._overridden = {name: set(fields) for name, fields in (overridden or {}).items()}

    def for_upstream(self, name: str, measured_prefill_ms_per_token: float | None = None) -> CostModel:
        """The upstream's cost model. For a local engine whose `prefill_ms_per_token` the config does not set, the
        engine's measured prefill speed (`engine_contexts`), when given, replaces the default."""
        model = self._models.get(name, self._default)
        measured = measured_prefill_ms_per_token
        if model.hosted or measured is None or measured <= 0:
            return model
        if "prefill_ms_per_token" in self._overridden.get(name, ()):
            return model
        return model.with_overrides({"prefill_ms_per_token": measured})

    @classmethod
    def from_config(cls, data: Mapping[str, Any], default_kind: str = DEFAULT_KIND) -> UpstreamPrices:
        """From a parsed `prefixscope.toml`. Raises `PriceError` for a malformed `[advice.cache_prices]`."""
        kinds = {}
        for upstream in data.get("upstreams") or ():
            if isinstance(upstream, dict) and isinstance(upstream.get("name"), str):
                kinds[upstream["name"]] = str(upstream.get("kind") or DEFAULT_KIND)
        advice = data.get("advice") or {}
        if not isinstance(advice, dict):
            raise PriceError("[advice] must be a table")
        unknown = set(advice) - {"cache_prices"}
        if unknown:
            raise PriceError(f"unknown [advice] keys: {sorted(unknown)}")
        prices = advice.get("cache_prices") or {}
        if not isinstance(prices, dict) or not all(isinstance(v, dict) for v in prices.values()):
            raise PriceError("[advice.cache_prices.<upstream>] must be tables of prices")
        models = {name: CostModel.for_kind(kind, prices.get(name)) for name, kind in kinds.items()}
        for name in set(prices) - set(kinds):
            raise PriceError(f"[advice.cache_prices.{name}] names no upstream of the config")
        return cls(models, default_kind, {name: set(values) for name, values in prices.items()})

    @classmethod
    def from_file(cls, path: Path | None, default_kind: str = DEFAULT_KIND) -> UpstreamPrices:
        """From the TOML file at `path` (None or missing: every upstream priced as `default_kind`). Raises
        `PriceError` for a file that does not parse."""
        if path is None or not path.exists():
            return cls({}, default_kind)
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise PriceError(f"{path}: {exc}") from exc
        return cls.from_config(data, default_kind)
