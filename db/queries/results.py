"""The small named results of the read-side queries."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from db.record_schema import listed_row
from db.records import RequestRecord, is_hit


@dataclass(frozen=True)
class CachedByTier:
    """Cached prompt tokens by the tier that served them: the engine's device pool, host memory, disk, and `unknown`
    for upstreams that do not report tiers (or a split that did not fit the cached count). The four add up to the
    cached tokens they split."""

    device: int = 0
    host: int = 0
    disk: int = 0
    unknown: int = 0

    @property
    def total(self) -> int:
        return self.device + self.host + self.disk + self.unknown

    @property
    def known(self) -> int:
        """Tokens whose tier is known."""
        return self.device + self.host + self.disk

    def __add__(self, other: CachedByTier) -> CachedByTier:
        return CachedByTier(
            self.device + other.device, self.host + other.host, self.disk + other.disk, self.unknown + other.unknown
        )


@dataclass(frozen=True)
class CacheFigures:
    """Cache and latency figures over a set of requests, as computed from the rollups.

    `token_hit_rate` is cached / prompt tokens over requests that reported both; `request_hit_share` the share of
    requests with any cached token among those that reported cached tokens. Both are None when nothing was known.
    `eligible_hit_rate` is cached / (prompt - new) tokens over requests with a token ledger (`db.ledger`: a
    conversation's new turns are unavoidable misses); None when no request had one.
    TTFT quantiles come from the rollups' histograms, interpolated within the smallest and largest value observed in
    the bin that holds them (`ttft_ranges_ms` states that bound); None without samples. A request counts as a hit when
    it reused more than the chat template's fixed opening (`db.records.is_hit`).

    `tiers` splits `cached_tokens` by the tier that served them (`CachedByTier`); `requests_with_known_tiers` counts
    the requests whose upstream reported the split. `cache_load_ms_total` is the engine's time loading host and disk
    KV back to the device, summed over the `requests_with_known_load` that reported it (`cache_load_ms_mean` is per
    such request; None without any). `requests_by_retention` counts requests per retention class asked for (only
    classes with requests; requests without a class are the rest of `requests`).
    """

    requests: int = 0
    error_requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    requests_with_known_cache: int = 0
    requests_with_hit: int = 0
    token_hit_rate: float | None = None
    eligible_hit_rate: float | None = None
    request_hit_share: float | None = None
    latency_mean_ms: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p95_ms: float | None = None
    ttft_hit_p50_ms: float | None = None
    ttft_hit_p95_ms: float | None = None
    ttft_hit_mean_ms: float | None = None
    ttft_miss_p50_ms: float | None = None
    ttft_miss_p95_ms: float | None = None
    ttft_miss_mean_ms: float | None = None
    tiers: CachedByTier = field(default_factory=CachedByTier)
    requests_with_known_tiers: int = 0
    cache_load_ms_total: float = 0.0
    cache_load_ms_mean: float | None = None
    requests_with_known_load: int = 0
    requests_by_retention: dict[str, int] = field(default_factory=dict)
    # Where each quantile lies for sure (`p50`, `p95`, `hit_p50`, ...): the smallest and largest TTFT observed in the
    # histogram bin that holds it (`db.histogram.quantile_range`); the estimate lies inside.
    ttft_ranges_ms: dict[str, tuple[float, float | None]] = field(default_factory=dict)


@dataclass(frozen=True)
class StatsRow(CacheFigures):
    """One time bucket (and group, when grouping) of `stats`. `group` is None when not grouping."""

    bucket_start: datetime | None = None
    group: str | None = None


@dataclass(frozen=True)
class Overview(CacheFigures):
    """Totals over a time range (`overview`), plus how requests were labelled."""

    since: datetime | None = None
    until: datetime | None = None
    miss_kinds: dict[str, int] = field(default_factory=dict)
    error_types: dict[str, int] = field(default_factory=dict)


@listed_row(RequestRecord)
class RequestRow:
    """A request as listed by `recent_requests`: the `listed` fields of `db.records.RequestRecord`, which declares
    them (`db.record_schema`); the prompt text and the key version are only in `request_detail`."""

    @property
    def cache_hit(self) -> bool | None:
        """True when cached tokens reach beyond the template's fixed opening, False on a known miss, None when
        unknown (`db.records.is_hit`)."""
        return is_hit(self.cached_tokens, self.template_tokens)

    @property
    def uncached_tokens(self) -> int | None:
        """Prompt tokens that had to be prefilled, when both counts are known."""
        if self.prompt_tokens is None or self.cached_tokens is None:
            return None
        return max(0, self.prompt_tokens - self.cached_tokens)


@dataclass(frozen=True)
class PrefixRow:
    """Reuse of one prompt prefix (by `prefix_hash`) over a time range."""

    prefix_hash: str
    requests: int
    requests_with_hit: int
    prompt_tokens: int
    cached_tokens: int
    first_seen: datetime
    last_seen: datetime

    @property
    def request_hit_share(self) -> float:
        """Share of this prefix's requests that hit the cache."""
        return self.requests_with_hit / self.requests if self.requests else 0.0


@dataclass(frozen=True)
class LabelCount:
    """How many requests carried a label (a normalization rule, a miss kind, an error type)."""

    value: str
    requests: int


@dataclass(frozen=True)
class GroupTotals(CacheFigures):
    """`totals_by`: cache figures over a whole range for one tenant, model or upstream (`group`)."""

    group: str = ""


@dataclass(frozen=True)
class MissReasonRow:
    """`miss_reasons_over_time`: requests and recomputed tokens with one miss reason in one time bucket."""

    bucket_start: datetime
    reason: str
    requests: int
    recomputed_tokens: int


@dataclass(frozen=True)
class MissReasonTotal:
    """`miss_reason_totals`: requests and recomputed tokens with one miss reason over a range."""

    reason: str
    requests: int
    recomputed_tokens: int


@dataclass(frozen=True)
class DivergenceLocation:
    """`divergence_locations`: how often prompts first differed from the cached prefix at one place.

    The place is a segment (`tools`, `system`, `messages[3]`) and the character offsets [char_offset_start,
    char_offset_end) inside it.
    """

    segment: str
    char_offset_start: int
    char_offset_end: int
    requests: int
    recomputed_tokens: int


@dataclass(frozen=True)
class NormalizationGains:
    """`normalization_gains`: what normalization gained on the requests where it was measured (sampled).

    `gain_tokens` are prompt tokens that hit the cache only because of normalization; `prompt_tokens` are those of
    the sampled requests, so `gain_share` is the share of prompt tokens normalization turned into hits.
    """

    sampled_requests: int = 0
    requests_with_gain: int = 0
    gain_tokens: int = 0
    prompt_tokens: int = 0

    @property
    def mean_gain_tokens(self) -> float | None:
        """Tokens gained per sampled request; None without samples."""
        return self.gain_tokens / self.sampled_requests if self.sampled_requests else None

    @property
    def gain_share(self) -> float | None:
        """Gained tokens as a share of the sampled requests' prompt tokens; None when there are none."""
        return self.gain_tokens / self.prompt_tokens if self.prompt_tokens else None
