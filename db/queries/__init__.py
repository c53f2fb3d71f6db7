"""Read-side queries shared by the gateway's stats API, the CLI and the dashboard.

Plain functions of a sync `Connection` or `Session` and plain arguments, returning frozen dataclasses. From async
code run them on an `AsyncConnection` with `await conn.run_sync(stats, since, ...)` or `db.engine.run_query`.
History (`stats`, `overview`, `rule_counts`, `label_counts`) reads the hourly rollups; the request explorer
(`recent_requests`, `request_detail`, `top_prefixes`) reads indexed request rows.
"""

from db.queries.catalog import models, tenants, upstreams
from db.queries.history import BUCKETS, GROUP_BY_CHOICES, bucket_floor, overview, stats
from db.queries.labels import label_counts, rule_counts
from db.queries.requests import recent_requests, request_detail, top_prefixes
from db.queries.results import CacheFigures, LabelCount, Overview, PrefixRow, RequestRow, StatsRow

__all__ = [
    "BUCKETS",
    "GROUP_BY_CHOICES",
    "CacheFigures",
    "LabelCount",
    "Overview",
    "PrefixRow",
    "RequestRow",
    "StatsRow",
    "bucket_floor",
    "label_counts",
    "models",
    "overview",
    "recent_requests",
    "request_detail",
    "rule_counts",
    "stats",
    "tenants",
    "top_prefixes",
    "upstreams",
]
