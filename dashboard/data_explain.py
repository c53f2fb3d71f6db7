"""The Why misses and What-if pages' data access: `dashboard.loaders_explain` and the what-if replay behind
`st.cache_data`, on the pooled engine of `dashboard.data`.

The replay is cached on every input that changes its figures (range, tenant, block budget, page size, grid, today's
setting), so moving between pages or re-running with the same choices costs nothing; a relative time range moves
with the clock a minute at a time, which starts a fresh replay at most once a minute while the page is open.
"""

from __future__ import annotations

from datetime import datetime

import streamlit as st

from dashboard import loaders_explain
from dashboard.data import LIVE_TTL_S, _read
from dashboard.what_if_model import CurrentSetting, TiersResult, WhatIfResult, run_tiers, run_what_if
from db.queries import RequestRow

# Replays are the expensive part; keep them a little longer than the live figures.
WHAT_IF_TTL_S = 120


@st.cache_data(ttl=LIVE_TTL_S, show_spinner=False)
def why_misses(url: str, since: datetime, until: datetime, tenant: str | None) -> loaders_explain.WhyMissesData:
    return _read(url, loaders_explain.load_why_misses, since, until, tenant)


@st.cache_data(ttl=LIVE_TTL_S, show_spinner=False)
def miss_examples(url: str, reason: str, since: datetime, until: datetime, tenant: str | None) -> list[RequestRow]:
    return _read(url, loaders_explain.load_miss_examples, reason, since, until, tenant)


@st.cache_data(ttl=WHAT_IF_TTL_S, show_spinner=False)
def chain_sample(
    url: str, since: datetime, until: datetime, tenant: str | None, max_blocks: int
) -> loaders_explain.ChainSample:
    return _read(url, loaders_explain.load_chain_sample, since, until, tenant, max_blocks)


@st.cache_data(ttl=WHAT_IF_TTL_S, show_spinner="Replaying the recorded chains ...")
def what_if(
    url: str,
    since: datetime,
    until: datetime,
    tenant: str | None,
    max_blocks: int,
    page_size: int,
    capacities: tuple[int, ...],
    policies: tuple[str, ...],
    ttls: tuple[float | None, ...],
    today: CurrentSetting | None,
) -> WhatIfResult:
    sample = chain_sample(url, since, until, tenant, max_blocks)
    return run_what_if(sample.requests, page_size, capacities, policies, ttls, today)


@st.cache_data(ttl=WHAT_IF_TTL_S, show_spinner="Computing the LRU curve ...")
def what_if_tiers(
    url: str,
    since: datetime,
    until: datetime,
    tenant: str | None,
    max_blocks: int,
    page_size: int,
    capacities: tuple[int, ...],
    host_capacity_tokens: int,
    ttl_s: float | None,
    today_capacity_tokens: int | None,
) -> TiersResult:
    """The What-if page's device + host tier curve (one pass over the sampled chains), cached like `what_if`."""
    sample = chain_sample(url, since, until, tenant, max_blocks)
    return run_tiers(sample.requests, page_size, capacities, host_capacity_tokens, ttl_s, today_capacity_tokens)
