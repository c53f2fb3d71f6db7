"""The ORM models. Migrations in `migrations/versions` create these tables; this module is their source of truth.

Tables:
- `tenants`, `api_keys`: who may call the gateway (keys are stored as hashes, never in plaintext);
- `requests`: one row per request;
- `request_chains`: the block hash chain of each recorded request, for the what-if cache simulator;
- `hourly_rollups`, `hourly_ttft_bins`, `hourly_label_counts`: per hour, tenant, model and upstream, the sums the
  history queries need, kept current by the writer in the same transaction as the request rows. They are additive
  (every column is a count or a sum), so a batch is folded in with a single upsert and hours add up into days;
- `hourly_prefix_rollups`, `hourly_miss_reasons`, `hourly_divergences`: per hour and tenant, reuse per prompt prefix,
  requests and recomputed tokens per miss reason, and where prompts diverged; additive in the same way.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from db.record_schema import Stored, stored_fields
from db.records import MISS_REASON_MAX, MODEL_NAME_MAX, SEGMENT_MAX, TENANT_NAME_MAX, RequestRecord
from db.timeutil import utc_now
from db.types import UTCDateTime, portable_json

# Deterministic constraint names, so that migrations can refer to them and batch mode on SQLite can rebuild tables.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}



class Base(DeclarativeBase):
    """Declarative base for every prefixscope table."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Tenant(Base):
    """A customer of the gateway; `settings` holds per-tenant options (e.g. opt-in rules, prompt storage)."""

    __tablename__ = "tenants"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(TENANT_NAME_MAX), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utc_now)
    settings: Mapped[dict[str, Any]] = mapped_column(portable_json(), default=dict)

    api_keys: Mapped[list[ApiKey]] = relationship(back_populates="tenant", cascade="all, delete-orphan")


class ApiKey(Base):
    """An API key: the public `key_id` plus a hash of the secret part. The plaintext exists only when created."""

    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    key_id: Mapped[str] = mapped_column(String(32), unique=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    secret_hash: Mapped[str] = mapped_column(String(128))
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    label: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utc_now)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    tenant: Mapped[Tenant] = relationship(back_populates="api_keys")


def _column_type(stored: Stored) -> Any:
    """The SQLAlchemy type of a record field's column kind (`db.record_schema.KINDS`)."""
    if stored.kind == "string":
        return String(stored.max_chars)
    return {
        "text": Text,
        "int": Integer,
        "smallint": SmallInteger,
        "float": Float,
        "bool": Boolean,
        "datetime": UTCDateTime,
        "json": portable_json,
    }[stored.kind]()


def _request_columns() -> list[Column[Any]]:
    """The `requests` columns, one per stored field of `RequestRecord` (`db.record_schema`)."""
    columns: list[Column[Any]] = []
    for item in stored_fields(RequestRecord):
        options: dict[str, Any] = {"nullable": item.nullable}
        if item.column == "id":
            options["primary_key"] = True
        if item.name == "created_at":
            options["index"] = True
        if item.stored.kind == "json":
            options["default"] = list
        columns.append(Column(item.column, _column_type(item.stored), **options))
    return columns


class RequestRecordRow(Base):
    """One request: a column per stored field of `db.records.RequestRecord`, which declares each (see
    `db.record_schema`); the explorer's indexes are declared here."""

    __table__ = Table(
        "requests",
        Base.metadata,
        *_request_columns(),
        # The explorer filters by one of these and pages newest first.
        Index("ix_requests_tenant_created_at", "tenant", "created_at"),
        Index("ix_requests_model_created_at", "model", "created_at"),
        Index("ix_requests_miss_kind_created_at", "miss_kind", "created_at"),
        Index("ix_requests_prefix_hash_created_at", "prefix_hash", "created_at"),
        Index("ix_requests_miss_reason_created_at", "miss_reason", "created_at"),
        Index("ix_requests_replica_created_at", "replica", "created_at"),
        # The conversation view reads one conversation's turns.
        Index("ix_requests_tenant_conversation_id", "tenant", "conversation_id"),
        # Only the rows that kept their prompt: finds a prefix's newest stored prompt (its label) at once, even for a
        # prefix with a million requests and no stored prompt at all.
        Index(
            "ix_requests_prefix_hash_stored_prompt",
            "prefix_hash",
            "created_at",
            sqlite_where=text("prompt_text IS NOT NULL"),
            postgresql_where=text("prompt_text IS NOT NULL"),
        ),
    )


class RequestChainRow(Base):
    """The block hash chain of one request (see `db.chains.RequestChain`), deleted with its request."""

    __tablename__ = "request_chains"

    request_id: Mapped[str] = mapped_column(ForeignKey("requests.id", ondelete="CASCADE"), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    tenant: Mapped[str] = mapped_column(String(TENANT_NAME_MAX))
    block_size: Mapped[int] = mapped_column(Integer)
    input_length: Mapped[int] = mapped_column(Integer)
    approximate: Mapped[bool] = mapped_column(Boolean)
    # Packed little-endian int64, 8 bytes per block.
    hash_ids: Mapped[bytes] = mapped_column(LargeBinary)

    __table_args__ = (Index("ix_request_chains_tenant_created_at", "tenant", "created_at"),)


class PromptSignatureRow(Base):
    """The prompt signature of one sampled request (see `db.signatures.PromptSignature`), deleted with its
    request; read by the fleet patterns."""

    __tablename__ = "prompt_signatures"

    request_id: Mapped[str] = mapped_column(ForeignKey("requests.id", ondelete="CASCADE"), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    tenant: Mapped[str] = mapped_column(String(TENANT_NAME_MAX))
    block_chars: Mapped[int] = mapped_column(Integer)
    text_chars: Mapped[int] = mapped_column(Integer)
    tool_chars: Mapped[int] = mapped_column(Integer)
    prompt_chars: Mapped[int] = mapped_column(Integer)
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    # Packed little-endian int64, 8 bytes per hash.
    head: Mapped[bytes] = mapped_column(LargeBinary)
    tail: Mapped[bytes] = mapped_column(LargeBinary)
    tools: Mapped[bytes] = mapped_column(LargeBinary)


class HourlyRollup(Base):
    """Sums over the requests of one UTC hour for one (tenant, model, upstream).

    Token sums skip unknown (NULL) values. The `cache_known_*` sums cover only requests that reported both prompt and
    cached tokens, which is what the token hit rate divides. A hit reused more than the chat template's fixed opening:
    `cached_tokens > template_tokens` (`db.records.is_hit`; 0 when the upstream does not report the opening).
    """

    __tablename__ = "hourly_rollups"

    bucket_start: Mapped[datetime] = mapped_column(UTCDateTime(), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(TENANT_NAME_MAX), primary_key=True)
    model: Mapped[str] = mapped_column(String(MODEL_NAME_MAX), primary_key=True)
    upstream: Mapped[str] = mapped_column(String(200), primary_key=True)
    requests: Mapped[int] = mapped_column(Integer, default=0)
    error_requests: Mapped[int] = mapped_column(Integer, default=0)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cached_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    completion_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cache_known_prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cache_known_cached_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    requests_with_known_cache: Mapped[int] = mapped_column(Integer, default=0)
    requests_with_hit: Mapped[int] = mapped_column(Integer, default=0)
    latency_ms_sum: Mapped[float] = mapped_column(Float, default=0.0)
    ttft_hit_ms_sum: Mapped[float] = mapped_column(Float, default=0.0)
    ttft_hit_count: Mapped[int] = mapped_column(Integer, default=0)
    ttft_miss_ms_sum: Mapped[float] = mapped_column(Float, default=0.0)
    ttft_miss_count: Mapped[int] = mapped_column(Integer, default=0)
    # Requests whose normalization gain was measured (sampled), how many gained, the tokens gained and the prompt
    # tokens of the sampled requests (what the gain is a share of).
    normalization_sampled_requests: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    normalization_requests_with_gain: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    normalization_gain_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    normalization_prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # Cached tokens by the tier that served them, over the requests whose split is known (`db.rollups.tier_split`);
    # the rest of `cached_tokens` came from an unknown tier. The engine's time loading host/disk KV back (ms), summed
    # over the requests that reported it.
    cached_tokens_device: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    cached_tokens_host: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    cached_tokens_disk: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    requests_with_known_tiers: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    cache_load_ms_sum: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    cache_load_count: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # The token ledger (`db.ledger`): its parts summed over the requests that have one, and the prompt and cached
    # tokens of those requests (what the eligible hit rate, cached / (prompt - new), divides).
    ledger_prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    ledger_cached_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    new_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    unknown_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    lost_system_changed_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    lost_tools_changed_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    lost_messages_changed_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    lost_answer_rewritten_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    lost_reordered_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    lost_volatile_value_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    lost_model_changed_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    lost_evicted_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    lost_expired_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    lost_routed_away_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    lost_page_alignment_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    lost_cache_scope_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")

    __table_args__ = (
        # Dashboard filters by tenant or model over a time range; the primary key already leads with bucket_start.
        Index("ix_hourly_rollups_tenant_bucket_start", "tenant", "bucket_start"),
        Index("ix_hourly_rollups_model_bucket_start", "model", "bucket_start"),
    )


class HourlyTtftBin(Base):
    """The TTFT histogram of an hourly rollup: how many requests fell into each log-spaced bin (`db.histogram`).

    Stored sparsely, one row per non-empty bin, so that bins add up with a plain upsert. `cache_state` is `hit`,
    `miss` or `unknown`; p50/p95 per state come from summing bins over a range.
    """

    __tablename__ = "hourly_ttft_bins"

    bucket_start: Mapped[datetime] = mapped_column(UTCDateTime(), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(TENANT_NAME_MAX), primary_key=True)
    model: Mapped[str] = mapped_column(String(MODEL_NAME_MAX), primary_key=True)
    upstream: Mapped[str] = mapped_column(String(200), primary_key=True)
    cache_state: Mapped[str] = mapped_column(String(8), primary_key=True)
    bin: Mapped[int] = mapped_column(SmallInteger, primary_key=True, autoincrement=False)
    requests: Mapped[int] = mapped_column(Integer, default=0)
    # The smallest and largest TTFT that fell into the bin (NULL for rows written before they were kept).
    ttft_min_ms: Mapped[float | None] = mapped_column(Float)
    ttft_max_ms: Mapped[float | None] = mapped_column(Float)


class HourlyLabelCount(Base):
    """Per-hour counts of labelled events: `dimension` is `rule` (a normalization rule that changed the request),
    `miss_kind`, `error_type`, `status` or `retention` (the retention class asked for), and `value` the label."""

    __tablename__ = "hourly_label_counts"

    bucket_start: Mapped[datetime] = mapped_column(UTCDateTime(), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(TENANT_NAME_MAX), primary_key=True)
    model: Mapped[str] = mapped_column(String(MODEL_NAME_MAX), primary_key=True)
    upstream: Mapped[str] = mapped_column(String(200), primary_key=True)
    dimension: Mapped[str] = mapped_column(String(16), primary_key=True)
    value: Mapped[str] = mapped_column(String(100), primary_key=True)
    requests: Mapped[int] = mapped_column(Integer, default=0)

    __table_args__ = (Index("ix_hourly_label_counts_dimension_bucket_start", "dimension", "bucket_start"),)


class HourlyPrefixRollup(Base):
    """Reuse of one prompt prefix (`prefix_hash`) by one tenant in one UTC hour; requests without a hash are left out.

    `first_seen` / `last_seen` are the earliest and latest request times in the hour (folded in with min/max, which
    is as safe as a sum with several writers and on replay).
    """

    __tablename__ = "hourly_prefix_rollups"

    bucket_start: Mapped[datetime] = mapped_column(UTCDateTime(), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(TENANT_NAME_MAX), primary_key=True)
    prefix_hash: Mapped[str] = mapped_column(String(128), primary_key=True)
    requests: Mapped[int] = mapped_column(Integer, default=0)
    requests_with_hit: Mapped[int] = mapped_column(Integer, default=0)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cached_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    first_seen: Mapped[datetime] = mapped_column(UTCDateTime())
    last_seen: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (Index("ix_hourly_prefix_rollups_tenant_bucket_start", "tenant", "bucket_start"),)


class HourlyMissReason(Base):
    """Requests and recomputed tokens per miss reason, tenant and UTC hour (requests without a reason are left out)."""

    __tablename__ = "hourly_miss_reasons"

    bucket_start: Mapped[datetime] = mapped_column(UTCDateTime(), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(TENANT_NAME_MAX), primary_key=True)
    miss_reason: Mapped[str] = mapped_column(String(MISS_REASON_MAX), primary_key=True)
    requests: Mapped[int] = mapped_column(Integer, default=0)
    recomputed_tokens: Mapped[int] = mapped_column(BigInteger, default=0)


class HourlyDivergence(Base):
    """Where prompts diverged from the cached prefix: requests per segment and character-offset bucket.

    `offset_bucket` is the first character offset of a `db.rollups.DIVERGENCE_BUCKET_CHARS`-wide bucket. Requests
    that reported a segment but no offset are left out.
    """

    __tablename__ = "hourly_divergences"

    bucket_start: Mapped[datetime] = mapped_column(UTCDateTime(), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(TENANT_NAME_MAX), primary_key=True)
    segment: Mapped[str] = mapped_column(String(SEGMENT_MAX), primary_key=True)
    offset_bucket: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    requests: Mapped[int] = mapped_column(Integer, default=0)
    recomputed_tokens: Mapped[int] = mapped_column(BigInteger, default=0)


class HourlyAdvice(Base):
    """The rule advisor's estimates per tenant, candidate rule (`db.advice.CANDIDATES`) and UTC hour: sampled
    requests, their actual prompt and cached tokens, the prompt and cached tokens estimated with the candidate on, and
    the TTFT and prefilled tokens of the samples whose TTFT is known (to turn tokens into prefill time). Keyed also by
    the fingerprint of the tenant settings the samples were served under (`db.advice.AdviceOutcome.settings`);
    `last_sample_at` is the latest sample's time, which tells the current settings apart from earlier ones."""

    __tablename__ = "hourly_advice"

    bucket_start: Mapped[datetime] = mapped_column(UTCDateTime(), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(TENANT_NAME_MAX), primary_key=True)
    settings_fingerprint: Mapped[str] = mapped_column(String(16), primary_key=True)
    candidate: Mapped[str] = mapped_column(String(64), primary_key=True)
    last_sample_at: Mapped[datetime] = mapped_column(UTCDateTime())
    samples: Mapped[int] = mapped_column(Integer, default=0)
    changed_samples: Mapped[int] = mapped_column(Integer, default=0)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cached_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    candidate_prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    candidate_cached_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    ttft_ms_sum: Mapped[float] = mapped_column(Float, default=0.0)
    ttft_prefilled_tokens: Mapped[int] = mapped_column(BigInteger, default=0)


class NamespaceTenant(Base):
    """Which tenant a cache namespace label belongs to (`gateway.tenancy.namespace_label` of its salt), as recorded
    with its requests; `last_seen` is the latest such request."""

    __tablename__ = "namespace_tenants"

    namespace_label: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(TENANT_NAME_MAX))
    last_seen: Mapped[datetime] = mapped_column(UTCDateTime())


class EngineContextRow(Base):
    """The last recorded context of one upstream engine (`db.engine_context`): its measured prefill speed and cache
    settings, which the history's figures use."""

    __tablename__ = "engine_contexts"

    upstream: Mapped[str] = mapped_column(String(200), primary_key=True)
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime())
    prefill_tokens_per_s: Mapped[float | None] = mapped_column(Float)
    capacity_tokens: Mapped[int | None] = mapped_column(BigInteger)
    page_size: Mapped[int | None] = mapped_column(Integer)
    eviction: Mapped[str | None] = mapped_column(String(32))
    ttl_s: Mapped[float | None] = mapped_column(Float)


def table_of(model: type[Base]) -> Table:
    """The Core `Table` of a model, typed as such (for insert/update/upsert statements)."""
    return cast(Table, model.__table__)
