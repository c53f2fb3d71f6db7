"""The Rule advice page's data access: `db.queries.advice` behind `st.cache_data`, on the pooled engine of
`dashboard.data`."""

from __future__ import annotations

from datetime import datetime

import streamlit as st

from dashboard.data import LIVE_TTL_S, _read
from db.queries.advice import TenantAdvice, advice


@st.cache_data(ttl=LIVE_TTL_S, show_spinner=False)
def rule_advice(
    url: str, since: datetime, until: datetime, tenant: str | None, min_samples: int
) -> list[TenantAdvice]:
    return _read(url, advice, since, until, tenant, min_samples)
