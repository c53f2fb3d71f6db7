"""Folding request records into the hourly rollup tables.

`RollupAccumulator` sums records in memory (pure Python); `apply_rollups` adds those sums to the tables with one
upsert per table (`INSERT ... ON CONFLICT DO UPDATE SET col = col + excluded.col`), which is safe with several
writers because every column is additive (or, for a prefix's first and last request time, a min or max).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, Final

from sqlalchemy import Connection, Table, func

from db.dialect import greatest, least, upsert_insert
from db.histogram import bin_of
from db.models import (
    HourlyDivergence,
    HourlyLabelCount,
    HourlyMissReason,
    HourlyPrefixRollup,
    HourlyRollup,
    HourlyTtftBin,
    table_of,
)
from db.record_schema import stored_fields
from db.records import MISS_REASON_MAX, SEGMENT_MAX, RequestRecord, is_hit
from db.timeutil import as_utc, floor_hour

RollupKey = tuple[datetime, str, str, str]  # (bucket_start, tenant, model, upstream)
PrefixKey = tuple[datetime, str, str]  # (bucket_start, tenant, prefix_hash)

ROLLUP_KEY_COLUMNS: Final = ("bucket_start", "tenant", "model", "upstream")
# Every additive column of `hourly_rollups`: what a batch adds with one upsert and what the history queries sum.
ROLLUP_SUM_COLUMNS: Final = tuple(
    column.name for column in table_of(HourlyRollup).c if column.name not in ROLLUP_KEY_COLUMNS
)
# (record field, rollup column) for each plain sum (NULL skipped) the record's schema declares (`Stored.sums`).
PLAIN_SUMS: Final = tuple(
    (item.name, column) for item in stored_fields(RequestRecord) for column in item.stored.sums
)
PREFIX_KEY_COLUMNS: Final = ("bucket_start", "tenant", "prefix_hash")
# Divergence offsets are counted in buckets of this many characters (the stored granularity of `hourly_divergences`).
DIVERGENCE_BUCKET_CHARS: Final = 64
LABEL_MAX_CHARS: Final = 100
# Label dimensions kept in `hourly_label_counts`.
DIMENSION_RULE: Final = "rule"
DIMENSION_MISS_KIND: Final = "miss_kind"
DIMENSION_ERROR_TYPE: Final = "error_type"
DIMENSION_STATUS: Final = "status"
# The retention class a request asked for (`db.records.RETENTION_CLASSES`); requests without one are not counted.
DIMENSION_RETENTION: Final = "retention"


def cache_state(cached_tokens: int | None, template_tokens: int | None = None) -> str:
    """`hit`, `miss` or `unknown`: the TTFT histogram each request belongs to (a hit reused more than the template's
    fixed opening, `db.records.is_hit`)."""
    hit = is_hit(cached_tokens, template_tokens)
    if hit is None:
        return "unknown"
    return "hit" if hit else "miss"


def tier_split(record: RequestRecord) -> tuple[int, int, int] | None:
    """`(device, host, disk)` cached tokens of a request, or None when the split is unknown: a tier not reported, no
    cached-token count, or a split that does not fit in `cached_tokens` (such a report is not trusted, so that the
    tier sums never exceed the cached tokens and the unknown remainder is never negative)."""
    split = (record.cached_tokens_device, record.cached_tokens_host, record.cached_tokens_disk)
    if record.cached_tokens is None or any(tokens is None or tokens < 0 for tokens in split):
        return None
    device, host, disk = (int(tokens or 0) for tokens in split)
    return (device, host, disk) if device + host + disk <= record.cached_tokens else None


def _zero_sums() -> dict[str, float]:
    return dict.fromkeys(ROLLUP_SUM_COLUMNS, 0)


class RollupAccumulator:
    """In-memory sums of request records per rollup key, ready to be added to the tables."""

    def __init__(self, floor: Callable[[datetime], datetime] = floor_hour) -> None:
        # The time bucket a record is counted in: the UTC hour for the rollup tables (minutes for `db.queries.minutes`).
        self._floor = floor
        self.sums: dict[RollupKey, dict[str, float]] = defaultdict(_zero_sums)
        self.ttft_bins: dict[tuple[RollupKey, str, int], int] = defaultdict(int)
        # The smallest and largest TTFT seen in each bin: quantiles are clamped to them (`db.histogram`).
        self.ttft_bin_ranges: dict[tuple[RollupKey, str, int], tuple[float, float]] = {}
        self.labels: dict[tuple[RollupKey, str, str], int] = defaultdict(int)
        self.prefixes: dict[PrefixKey, dict[str, Any]] = {}
        # (bucket_start, tenant, reason) and (bucket_start, tenant, segment, offset_bucket) -> [requests, tokens]
        self.miss_reasons: dict[tuple[datetime, str, str], list[int]] = defaultdict(lambda: [0, 0])
        self.divergences: dict[tuple[datetime, str, str, int], list[int]] = defaultdict(lambda: [0, 0])

    def __len__(self) -> int:
        return len(self.sums)

    def add(self, record: RequestRecord) -> None:
        """Count one request."""
        key: RollupKey = (self._floor(record.created_at), record.tenant, record.model, record.upstream)
        sums = self.sums[key]
        sums["requests"] += 1
        if record.status_code >= 400:
            sums["error_requests"] += 1
        for name, column in PLAIN_SUMS:
            value = getattr(record, name)
            if value is not None:
                sums[column] += value
        if record.cached_tokens is not None:
            sums["requests_with_known_cache"] += 1
            if record.cache_hit:
                sums["requests_with_hit"] += 1
            if record.prompt_tokens is not None:
                sums["cache_known_prompt_tokens"] += record.prompt_tokens
                sums["cache_known_cached_tokens"] += record.cached_tokens
        if record.new_tokens is not None and record.prompt_tokens is not None and record.cached_tokens is not None:
            sums["ledger_prompt_tokens"] += record.prompt_tokens  # what the eligible hit rate divides
            sums["ledger_cached_tokens"] += record.cached_tokens
        split = tier_split(record)
        if split is not None:
            for tier, tokens in zip(("device", "host", "disk"), split, strict=True):
                sums[f"cached_tokens_{tier}"] += tokens
            sums["requests_with_known_tiers"] += 1
        if record.cache_load_ms is not None:
            sums["cache_load_ms_sum"] += record.cache_load_ms
            sums["cache_load_count"] += 1
        state = cache_state(record.cached_tokens, record.template_tokens)
        if record.ttft_ms is not None:
            if state != "unknown":
                sums[f"ttft_{state}_ms_sum"] += record.ttft_ms
                sums[f"ttft_{state}_count"] += 1
            bin_key = (key, state, bin_of(record.ttft_ms))
            self.ttft_bins[bin_key] += 1
            seen = self.ttft_bin_ranges.get(bin_key)
            self.ttft_bin_ranges[bin_key] = (
                (record.ttft_ms, record.ttft_ms) if seen is None
                else (min(seen[0], record.ttft_ms), max(seen[1], record.ttft_ms))
            )
        for rule in dict.fromkeys(record.applied_rules):  # a rule listed twice still changed one request
            self.labels[(key, DIMENSION_RULE, rule[:LABEL_MAX_CHARS])] += 1
        if record.miss_kind is not None:
            self.labels[(key, DIMENSION_MISS_KIND, record.miss_kind[:LABEL_MAX_CHARS])] += 1
        if record.error_type is not None:
            self.labels[(key, DIMENSION_ERROR_TYPE, record.error_type[:LABEL_MAX_CHARS])] += 1
        self.labels[(key, DIMENSION_STATUS, str(record.status_code))] += 1
        if record.retention_class is not None:
            self.labels[(key, DIMENSION_RETENTION, record.retention_class[:LABEL_MAX_CHARS])] += 1
        if record.normalization_gain_tokens is not None:
            sums["normalization_sampled_requests"] += 1
            sums["normalization_prompt_tokens"] += record.prompt_tokens or 0
            if record.normalization_gain_tokens > 0:
                sums["normalization_requests_with_gain"] += 1
        self._add_explained(key[0], record)

    def _add_explained(self, bucket_start: datetime, record: RequestRecord) -> None:
        """The per-tenant tables: prefix reuse, miss reasons and divergence locations."""
        if record.prefix_hash is not None:
            moment = as_utc(record.created_at)
            prefix = self.prefixes.get((bucket_start, record.tenant, record.prefix_hash))
            if prefix is None:
                prefix = {"requests": 0, "requests_with_hit": 0, "prompt_tokens": 0, "cached_tokens": 0}
                prefix |= {"first_seen": moment, "last_seen": moment}
                self.prefixes[(bucket_start, record.tenant, record.prefix_hash)] = prefix
            prefix["requests"] += 1
            prefix["requests_with_hit"] += 1 if record.cache_hit else 0
            prefix["prompt_tokens"] += record.prompt_tokens or 0
            prefix["cached_tokens"] += record.cached_tokens or 0
            prefix["first_seen"] = min(prefix["first_seen"], moment)
            prefix["last_seen"] = max(prefix["last_seen"], moment)
        recomputed = record.recomputed_tokens or 0
        if record.miss_reason is not None:
            sums = self.miss_reasons[(bucket_start, record.tenant, record.miss_reason[:MISS_REASON_MAX])]
            sums[0] += 1
            sums[1] += recomputed
        if record.divergence_segment is not None and record.divergence_char_offset is not None:
            offset_bucket = divergence_bucket(record.divergence_char_offset)
            segment = record.divergence_segment[:SEGMENT_MAX]
            sums = self.divergences[(bucket_start, record.tenant, segment, offset_bucket)]
            sums[0] += 1
            sums[1] += recomputed

    def add_all(self, records: Iterable[RequestRecord]) -> RollupAccumulator:
        """Count every record; returns self for chaining."""
        for record in records:
            self.add(record)
        return self

    def prefix_rows(self) -> list[dict[str, Any]]:
        """Parameter rows for `hourly_prefix_rollups`, in key order."""
        return [dict(zip(PREFIX_KEY_COLUMNS, key, strict=True)) | sums for key, sums in sorted(self.prefixes.items())]

    def miss_reason_rows(self) -> list[dict[str, Any]]:
        """Parameter rows for `hourly_miss_reasons`, in key order."""
        return [
            {"bucket_start": start, "tenant": tenant, "miss_reason": reason}
            | {"requests": sums[0], "recomputed_tokens": sums[1]}
            for (start, tenant, reason), sums in sorted(self.miss_reasons.items())
        ]

    def divergence_rows(self) -> list[dict[str, Any]]:
        """Parameter rows for `hourly_divergences`, in key order."""
        return [
            {"bucket_start": start, "tenant": tenant, "segment": segment, "offset_bucket": offset}
            | {"requests": sums[0], "recomputed_tokens": sums[1]}
            for (start, tenant, segment, offset), sums in sorted(self.divergences.items())
        ]

    def rollup_rows(self) -> list[dict[str, Any]]:
        """Parameter rows for `hourly_rollups`, in key order (a stable lock order for concurrent writers)."""
        return [dict(zip(ROLLUP_KEY_COLUMNS, key, strict=True)) | sums for key, sums in sorted(self.sums.items())]

    def ttft_bin_rows(self) -> list[dict[str, Any]]:
        """Parameter rows for `hourly_ttft_bins`, in key order."""
        return [
            dict(zip(ROLLUP_KEY_COLUMNS, key, strict=True))
            | {"cache_state": state, "bin": index, "requests": count}
            | dict(zip(("ttft_min_ms", "ttft_max_ms"), self.ttft_bin_ranges[(key, state, index)], strict=True))
            for (key, state, index), count in sorted(self.ttft_bins.items())
        ]

    def label_rows(self) -> list[dict[str, Any]]:
        """Parameter rows for `hourly_label_counts`, in key order."""
        return [
            dict(zip(ROLLUP_KEY_COLUMNS, key, strict=True)) | {"dimension": dim, "value": value, "requests": count}
            for (key, dim, value), count in sorted(self.labels.items())
        ]


def divergence_bucket(char_offset: int) -> int:
    """The first offset of the `DIVERGENCE_BUCKET_CHARS`-wide bucket holding `char_offset` (negatives count as 0)."""
    return max(0, char_offset) // DIVERGENCE_BUCKET_CHARS * DIVERGENCE_BUCKET_CHARS


def _upsert_add(
    conn: Connection,
    table: Table,
    key_columns: Sequence[str],
    rows: list[dict[str, Any]],
    earliest: Sequence[str] = (),
    latest: Sequence[str] = (),
) -> None:
    """Add `rows` onto the table: sums for every value column, except min for `earliest` and max for `latest`."""
    if not rows:
        return
    stmt = upsert_insert(conn, table)
    set_: dict[str, Any] = {}
    for name in rows[0]:
        if name in key_columns:
            continue
        if name in earliest:
            # COALESCE: a row written before the column existed holds NULL, which would stick on SQLite.
            set_[name] = least(conn, func.coalesce(table.c[name], stmt.excluded[name]), stmt.excluded[name])
        elif name in latest:
            set_[name] = greatest(conn, func.coalesce(table.c[name], stmt.excluded[name]), stmt.excluded[name])
        else:
            set_[name] = table.c[name] + stmt.excluded[name]
    conn.execute(stmt.on_conflict_do_update(index_elements=list(key_columns), set_=set_), rows)


def apply_rollups(conn: Connection, accumulator: RollupAccumulator) -> None:
    """Add the accumulated sums to every rollup table (inside the caller's transaction)."""
    _upsert_add(conn, table_of(HourlyRollup), ROLLUP_KEY_COLUMNS, accumulator.rollup_rows())
    _upsert_add(
        conn,
        table_of(HourlyTtftBin),
        (*ROLLUP_KEY_COLUMNS, "cache_state", "bin"),
        accumulator.ttft_bin_rows(),
        earliest=("ttft_min_ms",),
        latest=("ttft_max_ms",),
    )
    _upsert_add(conn, table_of(HourlyLabelCount), (*ROLLUP_KEY_COLUMNS, "dimension", "value"), accumulator.label_rows())
    _upsert_add(
        conn,
        table_of(HourlyPrefixRollup),
        PREFIX_KEY_COLUMNS,
        accumulator.prefix_rows(),
        earliest=("first_seen",),
        latest=("last_seen",),
    )
    reason_key = ("bucket_start", "tenant", "miss_reason")
    _upsert_add(conn, table_of(HourlyMissReason), reason_key, accumulator.miss_reason_rows())
    divergence_key = ("bucket_start", "tenant", "segment", "offset_bucket")
    _upsert_add(conn, table_of(HourlyDivergence), divergence_key, accumulator.divergence_rows())


# Every table `apply_rollups` writes (and `db.store.rebuild_rollups` empties first).
ROLLUP_MODELS: Final = (
    HourlyRollup,
    HourlyTtftBin,
    HourlyLabelCount,
    HourlyPrefixRollup,
    HourlyMissReason,
    HourlyDivergence,
)
