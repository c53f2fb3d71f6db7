"""The named stages a request's record is built from (`gateway.recording.RequestTracker`), each a frozen value the
request path sets once: admitted -> parsed -> routed -> prepared -> placed (replica sets only) -> answered; the
explained stage is the recorder's explainer's answer with the request's conversation link
(`gateway.conversations.ConversationLink`: its `record_fields` go on the record), added when the record is
finished."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from db.records import UNAUTHENTICATED_TENANT
from gateway.provider_diagnostics import ProviderDiagnosis
from gateway.upstreams.base import CacheReport, UsageReport


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a request ended, as recorded: the status code sent to the client and the error type, if any."""

    status_code: int
    error_type: str | None = None


class ExplainContextLike(Protocol):
    """What the recorder reads or tells about a request's explain context (`gateway.explain.ExplainContext`)."""

    route: Any  # the route the request took: a replica set's placement replaces it
    request_id: str | None  # set by the tracker when the prepared stage is recorded
    replica: str | None  # set when the request is finished: the replica that answered it
    computed_tokens: int | None  # set when the request is finished: its prompt and answer tokens


class ConversationLinkLike(Protocol):
    """A request's place in its conversation (`gateway.conversations.ConversationLink`)."""

    def record_fields(self) -> dict[str, Any]: ...


class StageSetTwice(RuntimeError):
    """A request stage was recorded a second time: a programming error in the request path."""


@dataclass(frozen=True, slots=True)
class Admitted:
    """Who asked: the authenticated tenant and key."""

    tenant: str
    key_id: str | None


@dataclass(frozen=True, slots=True)
class Parsed:
    """What the body asked for. `retention_class`: the class the request asked for, recorded when none was sent
    (the Messages API's breakpoints); None elsewhere."""

    model: str
    stream: bool
    retention_class: str | None = None


@dataclass(frozen=True, slots=True)
class Routed:
    """The upstream the router chose for the model."""

    upstream: str


@dataclass(frozen=True, slots=True)
class Prepared:
    """The request as sent: the normalization rules applied, the keyed prompt hash (and text, when the tenant stores
    it), the engine's label of the tenant's cache namespace, the retention class sent upstream (None: none sent), and
    what the explainer knows of the request (None: not explained)."""

    applied_rules: tuple[str, ...] = ()
    prefix_hash: str | None = None
    prompt_text: str | None = None
    namespace_label: str | None = None
    retention_class: str | None = None
    explain: ExplainContextLike | None = None


@dataclass(frozen=True, slots=True)
class Placed:
    """Where a replica set sent the request: the last placement tried, after `failovers` retries on another replica
    (counted here, not recorded: the replica set's metrics count them), and the most cached tokens predicted on
    another replica (None: no other was predicted; the ledger's `routed_away`)."""

    replica: str | None
    routing_policy: str | None
    predicted_match_tokens: int | None
    routing_index_source: str | None
    failovers: int = 0
    best_other_match_tokens: int | None = None

    @classmethod
    def of(cls, placement: Any, failovers: int = 0) -> Placed:
        """From a `gateway.replicas.replica_set.Placement`."""
        replica = placement.replica.url if placement.replica is not None else None
        return cls(replica, placement.policy, placement.predicted_match_tokens, placement.index_source, failovers,
                   placement.best_other_match_tokens)


@dataclass(frozen=True, slots=True)
class Answered:
    """What the upstream answered: the outcome sent to the client (fixed just before the last response byte goes out,
    so a client that leaves right after the end of its response is recorded with the real outcome; None: the response
    was cut off before its end), the usage and the match report the upstream gave, the gateway-measured TTFT in ms
    (streams), the prompt tokens written to the cache (Messages API) and the provider's own cache diagnosis
    (`gateway.provider_diagnostics`)."""

    outcome: Outcome | None
    usage: UsageReport | None = None
    cache_report: CacheReport | None = None
    ttft_ms: float | None = None
    cache_write_tokens: int | None = None
    provider_diagnosis: ProviderDiagnosis | None = None


# What a stage holds until it is set (read by `finish` for a request that ended before reaching it).
NOT_ADMITTED = Admitted(UNAUTHENTICATED_TENANT, None)
NOT_PARSED = Parsed("", False)
NOT_ROUTED = Routed("")
NOT_PREPARED = Prepared()
NOT_PLACED = Placed(None, None, None, None)
