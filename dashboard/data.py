"""The pages' data access: `dashboard.loaders` behind `st.cache_data`, on one pooled engine per database URL.

Results are cached for a few seconds, so the auto-refreshing pages and several open browser tabs cost one query per
interval. Nothing is cached when a query fails (Streamlit does not cache exceptions), so a database that comes back
is picked up on the next run.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

import streamlit as st
from sqlalchemy import Engine

from dashboard import loaders
from dashboard.engine_client import CacheStats, CacheTreeSnapshot, fetch_cache_stats, fetch_cache_tree
from dashboard.prices import ModelUsage
from db.engine_context import EngineContext
from db.config import sqlite_path
from db.engine import create_sync_engine_for
from db.errors import DatabaseConfigError
from db.queries import RequestRow
from db.records import RequestRecord

T = TypeVar("T")

LIVE_TTL_S = 10
CATALOG_TTL_S = 60
ENGINE_TTL_S = 3


@st.cache_resource(show_spinner=False)
def _engine(url: str) -> Engine:
    return create_sync_engine_for(url, pool_pre_ping=True)


def _read(url: str, fn: Callable[..., T], *args: Any) -> T:
    path = sqlite_path(url)
    if path is not None and not path.exists():
        # Connecting would create an empty file; a reader should not, and the operator wants to know.
        raise DatabaseConfigError(f"the SQLite database {path} does not exist")
    with _engine(url).connect() as conn:
        return fn(conn, *args)


@st.cache_data(ttl=CATALOG_TTL_S, show_spinner=False)
def catalog(url: str) -> loaders.Catalog:
    return _read(url, loaders.load_catalog)


@st.cache_data(ttl=CATALOG_TTL_S, show_spinner=False)
def engine_context(url: str) -> EngineContext | None:
    return _read(url, loaders.load_engine_context)


@st.cache_data(ttl=CATALOG_TTL_S, show_spinner=False)
def namespace_tenants(url: str) -> dict[str, str]:
    return _read(url, loaders.load_namespace_tenants)


def namespace_tenants_if_readable(url: str) -> dict[str, str]:
    """`namespace_tenants`, or empty (namespaces are then shown by label) when the database cannot answer: the
    Engine cache page works without a database."""
    from sqlalchemy.exc import SQLAlchemyError

    from db.errors import DatabaseError

    try:
        return namespace_tenants(url)
    except (SQLAlchemyError, DatabaseError, OSError):
        return {}


@st.cache_data(ttl=LIVE_TTL_S, show_spinner=False)
def overview(url: str, since: datetime, until: datetime, tenant: str | None, model: str | None) -> loaders.OverviewData:
    return _read(url, loaders.load_overview, since, until, tenant, model)


@st.cache_data(ttl=LIVE_TTL_S, show_spinner=False)
def recent_requests(
    url: str,
    since: datetime,
    until: datetime,
    tenant: str | None,
    model: str | None,
    hit: bool | None,
    miss_kind: str | None,
    miss_reason: str | None = None,
) -> list[RequestRow]:
    limit = loaders.RECENT_REQUESTS_LIMIT
    return _read(url, loaders.load_recent_requests, since, until, tenant, model, hit, miss_kind, limit, miss_reason)


@st.cache_data(ttl=CATALOG_TTL_S, show_spinner=False)
def request_detail(url: str, request_id: str) -> RequestRecord | None:
    return _read(url, loaders.load_request_detail, request_id)


@st.cache_data(ttl=LIVE_TTL_S, show_spinner=False)
def prefixes(url: str, since: datetime, until: datetime, tenant: str | None) -> loaders.PrefixesData:
    return _read(url, loaders.load_prefixes, since, until, tenant)


@st.cache_data(ttl=LIVE_TTL_S, show_spinner=False)
def model_usage(url: str, since: datetime, until: datetime, tenant: str | None) -> list[ModelUsage]:
    return _read(url, loaders.load_model_usage, since, until, tenant)


@st.cache_data(ttl=ENGINE_TTL_S, show_spinner=False)
def engine_stats(engine_url: str, timeout_s: float, token: str | None = None) -> CacheStats:
    return fetch_cache_stats(engine_url, timeout_s, token)


@st.cache_data(ttl=ENGINE_TTL_S, show_spinner=False)
def engine_tree(engine_url: str, max_nodes: int, timeout_s: float, token: str | None = None) -> CacheTreeSnapshot:
    return fetch_cache_tree(engine_url, max_nodes, timeout_s, token)
