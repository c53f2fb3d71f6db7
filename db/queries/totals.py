"""Summing rollup rows and turning the sums into `CacheFigures` fields."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from sqlalchemy import ColumnElement, Connection, case, cast, func, select
from sqlalchemy.orm import Session

from db.histogram import Range, merge, quantile, quantile_range
from db.ledger import eligible_hit_rate
from db.models import HourlyRollup, HourlyTtftBin, table_of
from db.queries.results import CachedByTier
from db.records import RETENTION_CLASSES
from db.rollups import ROLLUP_SUM_COLUMNS

# Rollup columns summed by the history queries: all of them.
SUMMED: Final = ROLLUP_SUM_COLUMNS

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
        # Per state and bin, the smallest and largest TTFT observed (None when not kept).
        self.ranges: dict[str, dict[int, Range]] = {"hit": {}, "miss": {}, "unknown": {}}
        # Requests per retention class (`hourly_label_counts`, dimension `retention`).
        self.retention: dict[str, int] = {}

    def add_sums(self, row: Mapping[str, Any]) -> None:
        """Add a row holding (at least) the `SUMMED` columns; NULL sums (no rows) count as zero."""
        for name in SUMMED:
            self.sums[name] += row[name] or 0

    def add_retention(self, retention_class: str, count: int) -> None:
        """Add `count` requests that asked for `retention_class`."""
        self.retention[retention_class] = self.retention.get(retention_class, 0) + int(count)

    def add_bin(
        self, cache_state: str, index: int, count: int, low_ms: float | None = None, high_ms: float | None = None
    ) -> None:
        """Add `count` requests to a TTFT bin, whose samples lay within [low_ms, high_ms] when known."""
        states = self.bins.setdefault(cache_state, {})
        states[index] = states.get(index, 0) + int(count)
        ranges = self.ranges.setdefault(cache_state, {})
        ranges[index] = _widen(ranges.get(index), low_ms, high_ms)

    def figures(self) -> dict[str, Any]:
        """Keyword arguments for a `CacheFigures` (or subclass)."""
        s = self.sums
        everything = merge(self.bins.values())
        everything_ranges: dict[int, Range] = {}
        for state in self.ranges.values():
            for index, (low, high) in state.items():
                everything_ranges[index] = _widen(everything_ranges.get(index), low, high)
        sources = {"": (everything, everything_ranges)} | {
            f"{state}_": (self.bins[state], self.ranges.get(state, {})) for state in ("hit", "miss")
        }
        return {
            "requests": int(s["requests"]),
            "error_requests": int(s["error_requests"]),
            "prompt_tokens": int(s["prompt_tokens"]),
            "cached_tokens": int(s["cached_tokens"]),
            "completion_tokens": int(s["completion_tokens"]),
            "requests_with_known_cache": int(s["requests_with_known_cache"]),
            "requests_with_hit": int(s["requests_with_hit"]),
            "token_hit_rate": _ratio(s["cache_known_cached_tokens"], s["cache_known_prompt_tokens"]),
            "eligible_hit_rate": eligible_hit_rate(
                int(s["ledger_cached_tokens"]), int(s["ledger_prompt_tokens"]), int(s["new_tokens"])
            ),
            "request_hit_share": _ratio(s["requests_with_hit"], s["requests_with_known_cache"]),
            "latency_mean_ms": _ratio(s["latency_ms_sum"], s["requests"]),
            **{
                f"ttft_{prefix}{name}_ms": quantile(counts, q, ranges)
                for prefix, (counts, ranges) in sources.items()
                for name, q in (("p50", 0.5), ("p95", 0.95))
            },
            "tiers": CachedByTier(
                device=int(s["cached_tokens_device"]),
                host=int(s["cached_tokens_host"]),
                disk=int(s["cached_tokens_disk"]),
                # Never negative: a request's split counts only when it fits in its cached tokens (db.rollups).
                unknown=max(0, int(s["cached_tokens"] - s["cached_tokens_device"] - s["cached_tokens_host"]
                                   - s["cached_tokens_disk"])),
            ),
            "requests_with_known_tiers": int(s["requests_with_known_tiers"]),
            "cache_load_ms_total": float(s["cache_load_ms_sum"]),
            "cache_load_ms_mean": _ratio(s["cache_load_ms_sum"], s["cache_load_count"]),
            "requests_with_known_load": int(s["cache_load_count"]),
            "requests_by_retention": by_retention_class(self.retention),
            "ttft_hit_mean_ms": _ratio(s["ttft_hit_ms_sum"], s["ttft_hit_count"]),
            "ttft_miss_mean_ms": _ratio(s["ttft_miss_ms_sum"], s["ttft_miss_count"]),
            "ttft_ranges_ms": {
                f"{prefix}{name}": bound
                for prefix, (counts, ranges) in sources.items()
                for name, q in (("p50", 0.5), ("p95", 0.95))
                if (bound := quantile_range(counts, q, ranges)) is not None
            },
        }


def by_retention_class(counts: dict[str, int]) -> dict[str, int]:
    """`counts` without zeros, by retention class, shortest first (any other recorded value after them, by name)."""
    order = {name: index for index, name in enumerate(RETENTION_CLASSES)}
    ranked = sorted(counts.items(), key=lambda item: (order.get(item[0], len(order)), item[0]))
    return {name: count for name, count in ranked if count}


def _widen(seen: Range | None, low: float | None, high: float | None) -> Range:
    """The union of two observed ranges; unknown (None) as soon as either side is unknown."""
    if seen is None:
        return (low, high)
    merged_low = None if seen[0] is None or low is None else min(seen[0], low)
    merged_high = None if seen[1] is None or high is None else max(seen[1], high)
    return (merged_low, merged_high)


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
    # A bin's range is unknown when any of its rows predates the range columns: count those rows.
    unknown = func.sum(case((BINS.c.ttft_min_ms.is_(None), 1), else_=0)).label("unknown_ranges")
    stmt = (
        select(
            *columns,
            func.sum(BINS.c.requests).label("requests"),
            func.min(BINS.c.ttft_min_ms).label("ttft_min_ms"),
            func.max(BINS.c.ttft_max_ms).label("ttft_max_ms"),
            unknown,
        )
        .where(*where)
        .group_by(*columns)
    )
    return list(conn.execute(stmt).mappings())


def bin_args(row: Mapping[str, Any]) -> tuple[str, int, int, float | None, float | None]:
    """`Totals.add_bin` arguments from a `summed_bins` row (no range when some of its rows did not keep one)."""
    known = not row["unknown_ranges"]
    low, high = (row["ttft_min_ms"], row["ttft_max_ms"]) if known else (None, None)
    return row["cache_state"], row["bin"], row["requests"], low, high
