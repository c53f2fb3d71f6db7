"""What the "Why misses" and "What-if" pages read, as plain functions of a SQLAlchemy connection.

No Streamlit and no SQL here, as in `dashboard.loaders`: `dashboard.data_explain` caches these for the pages and
`prefixscope bench dashboard` times the very same functions. The what-if replay itself lives in
`dashboard.what_if_model`; this module only reads the chains it replays.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection

from dashboard.loaders import bucket_for_span
from db import queries
from db.queries import DivergenceLocation, MissReasonRow, MissReasonTotal, NormalizationGains, RequestRow
from db.simulation import TraceRequest, trace_request_from_chain

TOP_LOCATIONS_LIMIT = 15
MISS_EXAMPLES_LIMIT = 20
# The newest chains are read in windows going back from the end of the range, each twice as long as the one before,
# so a budget of blocks is met after a handful of short index range scans instead of a scan of the whole range.
FIRST_CHAIN_WINDOW = timedelta(hours=1)
# The reason that loses nothing: the request was served from cache as far as it could be.
HIT_REASON = "hit"


@dataclass(frozen=True)
class WhyMissesData:
    """Everything the Why misses page shows but the examples: per-reason totals and series, divergence places,
    normalization gains."""

    totals: list[MissReasonTotal]
    series: list[MissReasonRow]
    bucket: str
    # Start of the bucket holding `since`: where the chart's time axis begins.
    first_bucket_start: datetime
    locations: list[DivergenceLocation]
    gains: NormalizationGains

    @property
    def misses(self) -> list[MissReasonTotal]:
        """The totals of every reason but `hit`, most requests first."""
        return [row for row in self.totals if row.reason != HIT_REASON]

    @property
    def explained_requests(self) -> int:
        """Requests with any recorded reason, hits included."""
        return sum(row.requests for row in self.totals)

    @property
    def tokens_lost(self) -> int:
        """Prompt tokens prefilled again because the prompt diverged from what had been cached."""
        return sum(row.recomputed_tokens for row in self.totals)


@dataclass(frozen=True)
class ChainSample:
    """The newest stored block hash chains of a range, at most `max_blocks` blocks (the newest chain is always kept),
    as trace requests in time order."""

    requests: tuple[TraceRequest, ...]
    max_blocks: int
    # False when chains of the range older than the first kept one were left out (or not read) to stay within budget.
    covers_range: bool

    @property
    def num_requests(self) -> int:
        return len(self.requests)

    @property
    def num_blocks(self) -> int:
        return sum(len(request.hash_ids) for request in self.requests)

    @property
    def num_approximate(self) -> int:
        """Chains the gateway hashed from text because the engine returned no token-block hashes."""
        return sum(1 for request in self.requests if request.approximate)

    @property
    def block_sizes(self) -> tuple[int, ...]:
        return tuple(sorted({request.block_size for request in self.requests}))

    @property
    def first_s(self) -> float | None:
        return self.requests[0].timestamp_s if self.requests else None

    @property
    def last_s(self) -> float | None:
        return self.requests[-1].timestamp_s if self.requests else None


def load_why_misses(
    conn: Connection,
    since: datetime,
    until: datetime,
    tenant: str | None,
    locations_limit: int = TOP_LOCATIONS_LIMIT,
) -> WhyMissesData:
    """Reasons in total and per time bucket, the commonest divergence places and normalization gains (rollups)."""
    bucket = bucket_for_span(until - since)
    return WhyMissesData(
        totals=queries.miss_reason_totals(conn, since, until, tenant=tenant),
        series=queries.miss_reasons_over_time(conn, since, until, bucket=bucket, tenant=tenant),
        bucket=bucket,
        first_bucket_start=queries.bucket_floor(since, bucket),
        locations=queries.divergence_locations(conn, since, until, limit=locations_limit, tenant=tenant),
        gains=queries.normalization_gains(conn, since, until, tenant=tenant),
    )


def load_miss_examples(
    conn: Connection,
    reason: str,
    since: datetime,
    until: datetime,
    tenant: str | None,
    limit: int = MISS_EXAMPLES_LIMIT,
) -> list[RequestRow]:
    """The newest requests of the range that missed for `reason`."""
    return queries.miss_examples(conn, reason, since, until, limit=limit, tenant=tenant)


def load_chain_sample(
    conn: Connection, since: datetime, until: datetime, tenant: str | None, max_blocks: int
) -> ChainSample:
    """The newest chains of [since, until) holding at most `max_blocks` blocks in all, oldest first."""
    windows: list[list[TraceRequest]] = []  # newest window first
    num_blocks = 0
    end, width = until, FIRST_CHAIN_WINDOW
    while end > since and num_blocks < max_blocks:
        start = max(since, end - width)
        window = [
            trace_request_from_chain(entry.created_at, entry.chain)
            for entry in queries.iter_chains(conn, start, end, tenant=tenant)
        ]
        windows.append(window)
        num_blocks += sum(len(request.hash_ids) for request in window)
        end, width = start, width * 2
    newest_first = [request for window in windows for request in reversed(window)]
    kept: list[TraceRequest] = []
    kept_blocks = 0
    for request in newest_first:
        if kept and kept_blocks + len(request.hash_ids) > max_blocks:
            break
        kept.append(request)
        kept_blocks += len(request.hash_ids)
    covers_range = len(kept) == len(newest_first) and end <= since
    return ChainSample(requests=tuple(reversed(kept)), max_blocks=max_blocks, covers_range=covers_range)
