"""The Rule advice page's data access: `db.queries.advice`, `.retention` and `.patterns` behind `st.cache_data`, on
the pooled engine of `dashboard.data`."""

from __future__ import annotations

from datetime import datetime

import streamlit as st

from dashboard.data import LIVE_TTL_S, _read
from db.patterns.finder import FleetPattern
from db.queries.advice import TenantAdvice, advice
from db.queries.patterns import fleet_patterns
from db.queries.retention import retention_advice
from db.retention.advice import TenantRetention
from db.retention.costs import CostModel


@st.cache_data(ttl=LIVE_TTL_S, show_spinner=False)
def rule_advice(
    url: str, since: datetime, until: datetime, tenant: str | None, min_samples: int
) -> list[TenantAdvice]:
    return _read(url, advice, since, until, tenant, min_samples)


@st.cache_data(ttl=LIVE_TTL_S, show_spinner=False)
def retention(url: str, since: datetime, until: datetime, tenant: str | None, kind: str) -> list[TenantRetention]:
    """Retention advice with every upstream priced as `kind` (the page's choice)."""
    model = CostModel.for_kind(kind)
    return _read(url, retention_advice, since, lambda _: model, until, tenant)


@st.cache_data(ttl=LIVE_TTL_S, show_spinner=False)
def patterns(url: str, since: datetime, until: datetime, tenant: str | None) -> list[FleetPattern]:
    return _read(url, fleet_patterns, since, until, tenant)
