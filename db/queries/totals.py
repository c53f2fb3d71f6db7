"""Summing rollup rows and turning the sums into `CacheFigures` fields."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from sqlalchemy import ColumnElement, Connection, cast, func, select
from sqlalchemy.orm import Session

from db.histogram import merge, quantile
from db.models import HourlyRollup, HourlyTtftBin, table_of

# Rollup columns summed by the history queries.
SUMMED: Final = (
    "requests",
    "error_requests",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "cache_known_prompt_tokens",
    "cache_known_cached_tokens",
    "requests_with_known_cache",
    "requests_with_hit",
    "latency_ms_sum",
    "ttft_hit_ms_sum",
    "ttft_hit_count",
    "ttft_miss_ms_sum",
    "ttft_miss_count",
)

Reader = Connection | Session
ROLLUPS = table_of(HourlyRollup)
BINS = table_of(HourlyTtftBin)


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator else None


class Totals:
    """Running sums of rollup columns and TTFT bins for one group of rollup rows."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = dict.fromkeys(SUMMED, 0)
        self.bins: dict[str, dict[int, int]] = {"hit": {}, "miss": {}, "unknown": {}}

    def add_sums(self, row: Mapping[str, Any]) -> None:
        """Add a row holding (at least) the `SUMMED` columns; NULL sums (no rows) count as zero."""
        for name in SUMMED:
            self.sums[name] += row[name] or 0

    def add_bin(self, cache_state: str, index: int, count: int) -> None:
        """Add `count` requests to a TTFT bin."""
        states = self.bins.setdefault(cache_state, {})
        states[index] = states.get(index, 0) + int(count)

    def figures(self) -> dict[str, Any]:
        """Keyword arguments for a `CacheFigures` (or subclass)."""
        s = self.sums
        everything = merge(self.bins.values())
        return {
            "requests": int(s["requests"]),
            "error_requests": int(s["error_requests"]),
            "prompt_tokens": int(s["prompt_tokens"]),
            "cached_tokens": int(s["cached_tokens"]),
            "completion_tokens": int(s["completion_tokens"]),
            "requests_with_known_cache": int(s["requests_with_known_cache"]),
            "requests_with_hit": int(s["requests_with_hit"]),
            "token_hit_rate": _ratio(s["cache_known_cached_tokens"], s["cache_known_prompt_tokens"]),
            "request_hit_share": _ratio(s["requests_with_hit"], s["requests_with_known_cache"]),
            "latency_mean_ms": _ratio(s["latency_ms_sum"], s["requests"]),
            "ttft_p50_ms": quantile(everything, 0.5),
            "ttft_p95_ms": quantile(everything, 0.95),
            "ttft_hit_p50_ms": quantile(self.bins["hit"], 0.5),
            "ttft_hit_p95_ms": quantile(self.bins["hit"], 0.95),
            "ttft_hit_mean_ms": _ratio(s["ttft_hit_ms_sum"], s["ttft_hit_count"]),
            "ttft_miss_p50_ms": quantile(self.bins["miss"], 0.5),
            "ttft_miss_p95_ms": quantile(self.bins["miss"], 0.95),
            "ttft_miss_mean_ms": _ratio(s["ttft_miss_ms_sum"], s["ttft_miss_count"]),
        }


def rollup_filters(table: Any, since: Any, until: Any, **equal: str | None) -> list[ColumnElement[bool]]:
    """WHERE clauses for rollup rows in [since, until) (hour buckets) and the given column equalities."""
    clauses: list[ColumnElement[bool]] = [table.c.bucket_start >= since, table.c.bucket_start < until]
    for column, value in equal.items():
        if value is not None:
            clauses.append(table.c[column] == value)
    return clauses


def summed_rollups(conn: Reader, where: list[ColumnElement[bool]], group_columns: list[Any]) -> list[Any]:
    """Rows of `group_columns` plus the `SUMMED` sums, one per distinct group."""
    stmt = (
        # Cast back to the column type: PostgreSQL sums BIGINT into NUMERIC, which arrives as Decimal.
        select(*group_columns, *(cast(func.sum(ROLLUPS.c[name]), ROLLUPS.c[name].type).label(name) for name in SUMMED))
        .where(*where)
        .group_by(*group_columns)
    )
    return list(conn.execute(stmt).mappings())


def summed_bins(conn: Reader, where: list[ColumnElement[bool]], group_columns: list[Any]) -> list[Any]:
    """Rows of `group_columns`, cache_state, bin and the summed request count."""
    columns = [*group_columns, BINS.c.cache_state, BINS.c.bin]
    stmt = select(*columns, func.sum(BINS.c.requests).label("requests")).where(*where).group_by(*columns)
    return list(conn.execute(stmt).mappings())
