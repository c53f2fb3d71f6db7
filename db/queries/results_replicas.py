"""Results of the replica queries (`db.queries.replicas`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class ReplicaBucket:
    bucket_start: datetime
    replica: str
    requests: int
    prompt_tokens: int
    cached_tokens: int
    request_share: float  # of all routed requests in the bucket
    # Over the requests with a token ledger (`db.ledger`): prompt - new tokens, and the cached tokens among them.
    eligible_tokens: int = 0
    eligible_cached_tokens: int = 0

    @property
    def token_hit_rate(self) -> float | None:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None

    @property
    def eligible_hit_rate(self) -> float | None:
        """cached / (prompt - new) over the requests with a ledger; None without any."""
        return min(1.0, self.eligible_cached_tokens / self.eligible_tokens) if self.eligible_tokens else None


@dataclass(frozen=True)
class RouterAccuracy:
    replica: str
    index_source: str  # events | approximate | none (| precise, rows from before the KV events)
    requests: int
    predicted_tokens: int
    actual_cached_tokens: int
    hit_miss_agreement: float  # share of requests where predicted > 0 exactly when actual > 0
    mean_abs_error_tokens: float
