"""Folding request records into the hourly rollup tables.

`RollupAccumulator` sums records in memory (pure Python); `apply_rollups` adds those sums to the tables with one
upsert per table (`INSERT ... ON CONFLICT DO UPDATE SET col = col + excluded.col`), which is safe with several
writers because every column is additive.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, Final

from sqlalchemy import Connection, Table

from db.dialect import upsert_insert
from db.histogram import bin_of
from db.models import HourlyLabelCount, HourlyRollup, HourlyTtftBin, table_of
from db.records import RequestRecord
from db.timeutil import floor_hour

RollupKey = tuple[datetime, str, str, str]  # (bucket_start, tenant, model, upstream)

ROLLUP_KEY_COLUMNS: Final = ("bucket_start", "tenant", "model", "upstream")
_SUM_COLUMNS: Final = (
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
LABEL_MAX_CHARS: Final = 100
# Label dimensions kept in `hourly_label_counts`.
DIMENSION_RULE: Final = "rule"
DIMENSION_MISS_KIND: Final = "miss_kind"
DIMENSION_ERROR_TYPE: Final = "error_type"
DIMENSION_STATUS: Final = "status"


def cache_state(cached_tokens: int | None) -> str:
    """`hit`, `miss` or `unknown`: the TTFT histogram each request belongs to."""
    if cached_tokens is None:
        return "unknown"
    return "hit" if cached_tokens > 0 else "miss"


def _zero_sums() -> dict[str, float]:
    return dict.fromkeys(_SUM_COLUMNS, 0)


class RollupAccumulator:
    """In-memory sums of request records per rollup key, ready to be added to the tables."""

    def __init__(self) -> None:
        self.sums: dict[RollupKey, dict[str, float]] = defaultdict(_zero_sums)
        self.ttft_bins: dict[tuple[RollupKey, str, int], int] = defaultdict(int)
        self.labels: dict[tuple[RollupKey, str, str], int] = defaultdict(int)

    def __len__(self) -> int:
        return len(self.sums)

    def add(self, record: RequestRecord) -> None:
        """Count one request."""
        key: RollupKey = (floor_hour(record.created_at), record.tenant, record.model, record.upstream)
        sums = self.sums[key]
        sums["requests"] += 1
        if record.status_code >= 400:
            sums["error_requests"] += 1
        if record.prompt_tokens is not None:
            sums["prompt_tokens"] += record.prompt_tokens
        if record.completion_tokens is not None:
            sums["completion_tokens"] += record.completion_tokens
        if record.cached_tokens is not None:
            sums["cached_tokens"] += record.cached_tokens
            sums["requests_with_known_cache"] += 1
            if record.cached_tokens > 0:
                sums["requests_with_hit"] += 1
            if record.prompt_tokens is not None:
                sums["cache_known_prompt_tokens"] += record.prompt_tokens
                sums["cache_known_cached_tokens"] += record.cached_tokens
        sums["latency_ms_sum"] += record.latency_ms
        state = cache_state(record.cached_tokens)
        if record.ttft_ms is not None:
            if state != "unknown":
                sums[f"ttft_{state}_ms_sum"] += record.ttft_ms
                sums[f"ttft_{state}_count"] += 1
            self.ttft_bins[(key, state, bin_of(record.ttft_ms))] += 1
        for rule in dict.fromkeys(record.applied_rules):  # a rule listed twice still changed one request
            self.labels[(key, DIMENSION_RULE, rule[:LABEL_MAX_CHARS])] += 1
        if record.miss_kind is not None:
            self.labels[(key, DIMENSION_MISS_KIND, record.miss_kind[:LABEL_MAX_CHARS])] += 1
        if record.error_type is not None:
            self.labels[(key, DIMENSION_ERROR_TYPE, record.error_type[:LABEL_MAX_CHARS])] += 1
        self.labels[(key, DIMENSION_STATUS, str(record.status_code))] += 1

    def add_all(self, records: Iterable[RequestRecord]) -> RollupAccumulator:
        """Count every record; returns self for chaining."""
        for record in records:
            self.add(record)
        return self

    def rollup_rows(self) -> list[dict[str, Any]]:
        """Parameter rows for `hourly_rollups`, in key order (a stable lock order for concurrent writers)."""
        return [dict(zip(ROLLUP_KEY_COLUMNS, key, strict=True)) | sums for key, sums in sorted(self.sums.items())]

    def ttft_bin_rows(self) -> list[dict[str, Any]]:
        """Parameter rows for `hourly_ttft_bins`, in key order."""
        return [
            dict(zip(ROLLUP_KEY_COLUMNS, key, strict=True)) | {"cache_state": state, "bin": index, "requests": count}
            for (key, state, index), count in sorted(self.ttft_bins.items())
        ]

    def label_rows(self) -> list[dict[str, Any]]:
        """Parameter rows for `hourly_label_counts`, in key order."""
        return [
            dict(zip(ROLLUP_KEY_COLUMNS, key, strict=True)) | {"dimension": dim, "value": value, "requests": count}
            for (key, dim, value), count in sorted(self.labels.items())
        ]


def _upsert_add(conn: Connection, table: Table, key_columns: Sequence[str], rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    stmt = upsert_insert(conn, table)
    value_columns = [name for name in rows[0] if name not in key_columns]
    stmt = stmt.on_conflict_do_update(
        index_elements=list(key_columns),
        set_={name: table.c[name] + stmt.excluded[name] for name in value_columns},
    )
    conn.execute(stmt, rows)


def apply_rollups(conn: Connection, accumulator: RollupAccumulator) -> None:
    """Add the accumulated sums to the three rollup tables (inside the caller's transaction)."""
    _upsert_add(conn, table_of(HourlyRollup), ROLLUP_KEY_COLUMNS, accumulator.rollup_rows())
    _upsert_add(conn, table_of(HourlyTtftBin), (*ROLLUP_KEY_COLUMNS, "cache_state", "bin"), accumulator.ttft_bin_rows())
    _upsert_add(conn, table_of(HourlyLabelCount), (*ROLLUP_KEY_COLUMNS, "dimension", "value"), accumulator.label_rows())
