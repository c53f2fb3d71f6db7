"""Read-side queries shared by the gateway's stats API, the CLI and the dashboard.

Plain functions of a sync `Connection` or `Session` and plain arguments, returning frozen dataclasses. From async
code run them on an `AsyncConnection` with `await conn.run_sync(stats, since, ...)` or `db.engine.run_query`.
History (`stats`, `overview`, `totals_by`, `rule_counts`, `label_counts`, `top_prefixes`, `miss_reasons_over_time`,
`miss_reason_totals`, `divergence_locations`, `normalization_gains`) reads the hourly rollups; the request explorer
(`recent_requests`, `request_detail`, `miss_examples`, `prefix_labels`) reads indexed request rows, and
`iter_chains` streams stored hash chains. Every history row (`CacheFigures`) also splits its cached tokens by the
tier that served them (`tiers`: device, host, disk, unknown), with the engine's cache load time and requests per
retention class; `tier_totals` folds a series of rows into one `TierTotals`.
"""

from db.queries.catalog import first_seen, models, namespace_tenants, tenants, upstreams
from db.queries.chains import ChainEntry, iter_chains
from db.queries.history import (
    BUCKETS,
    GROUP_BY_CHOICES,
    REJECTED_GROUP,
    bucket_floor,
    overview,
    stats,
    totals_by,
)
from db.queries.labels import label_counts, rule_counts
from db.queries.misses import (
    divergence_locations,
    miss_examples,
    miss_reason_totals,
    miss_reasons_over_time,
    normalization_gains,
)
from db.queries.prefixes import prefix_labels, top_prefixes
from db.queries.requests import recent_requests, request_detail
from db.queries.results import (
    CachedByTier,
    CacheFigures,
    DivergenceLocation,
    GroupTotals,
    LabelCount,
    MissReasonRow,
    MissReasonTotal,
    NormalizationGains,
    Overview,
    PrefixRow,
    RequestRow,
    StatsRow,
)
from db.queries.tiers import TierTotals, tier_totals

__all__ = [
    "REJECTED_GROUP",
    "BUCKETS",
    "GROUP_BY_CHOICES",
    "CachedByTier",
    "CacheFigures",
    "ChainEntry",
    "DivergenceLocation",
    "GroupTotals",
    "LabelCount",
    "MissReasonRow",
    "MissReasonTotal",
    "NormalizationGains",
    "Overview",
    "PrefixRow",
    "RequestRow",
    "StatsRow",
    "TierTotals",
    "bucket_floor",
    "divergence_locations",
    "iter_chains",
    "label_counts",
    "miss_examples",
    "miss_reason_totals",
    "miss_reasons_over_time",
    "first_seen",
    "models",
    "namespace_tenants",
    "normalization_gains",
    "overview",
    "prefix_labels",
    "recent_requests",
    "request_detail",
    "rule_counts",
    "stats",
    "tenants",
    "tier_totals",
    "top_prefixes",
    "totals_by",
    "upstreams",
]
