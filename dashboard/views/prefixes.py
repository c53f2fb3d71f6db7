"""Prefixes and rules: the most reused prompt prefixes, tokens saved per prefix, normalization rules, tenants."""

from __future__ import annotations

import streamlit as st

from dashboard import charts, data, ui
from dashboard.data_conversations import eligible_hit_rates

settings = ui.load_settings()
st.title("Prefixes and rules")

catalog = ui.read_database(data.catalog, settings.database_url)
if catalog.is_empty:
    ui.stop_with_info("No requests recorded yet. Send traffic through the gateway to see prefixes here.")
filters = ui.sidebar_filters(catalog.tenants, catalog.models, with_model=False, first_seen=catalog.first_seen).refreshed()
result = ui.read_database(data.prefixes, settings.database_url, filters.since, filters.until, filters.tenant)
if result.requests_in_range == 0:
    ui.stop_with_info("No requests in this time range. Pick a longer range or another tenant.")

st.subheader("Most reused prefixes")
if not result.prefixes:
    st.info("No request in this range carries a prefix hash.")
else:
    prefix_rows = [
        {
            "prefix": row.prefix_hash[:12],
            "label": result.labels.get(row.prefix_hash, ""),
            "requests": row.requests,
            "requests with hit": row.request_hit_share,
            "tokens saved": row.cached_tokens,
            "prompt tokens": row.prompt_tokens,
            "token hit rate": row.cached_tokens / row.prompt_tokens if row.prompt_tokens else None,
            "last seen (UTC)": row.last_seen.replace(tzinfo=None),
            "prefix hash": row.prefix_hash,
        }
        for row in result.prefixes
    ]
    st.caption(
        "Ranked by tokens served from cache. A prefix with many requests but a low hit share keeps being "
        "invalidated: look at its requests' miss kinds and rules."
    )
    st.dataframe(
        prefix_rows,
        hide_index=True,
        column_config={
            "label": st.column_config.TextColumn(width="large"),
            "requests": st.column_config.NumberColumn(format="localized"),
            "tokens saved": st.column_config.NumberColumn(format="localized"),
            "prompt tokens": st.column_config.NumberColumn(format="localized"),
            "requests with hit": st.column_config.ProgressColumn(format="percent", min_value=0.0, max_value=1.0),
            "token hit rate": st.column_config.ProgressColumn(format="percent", min_value=0.0, max_value=1.0),
            "last seen (UTC)": st.column_config.DatetimeColumn(format="YYYY-MM-DD HH:mm"),
        },
    )
    top = result.prefixes[:15]
    st.plotly_chart(
        charts.horizontal_bars(
            [result.labels.get(row.prefix_hash) or row.prefix_hash[:12] for row in top],
            [row.cached_tokens for row in top],
            title="Tokens saved per prefix",
            x_title="cached tokens",
        ),
        width="stretch",
    )

st.subheader("Normalization rules")
if not result.rules:
    st.info("No normalization rule changed a request in this range.")
else:
    st.dataframe(
        [
            {
                "rule": item.value,
                "requests changed": item.requests,
                "share of requests": item.requests / result.requests_in_range,
            }
            for item in result.rules
        ],
        hide_index=True,
        column_config={
            "share of requests": st.column_config.ProgressColumn(format="percent", min_value=0.0, max_value=1.0)
        },
    )

st.subheader("Tenants")
eligible = ui.read_database(
    eligible_hit_rates, settings.database_url, filters.since, filters.until, filters.tenant, None, "tenant"
)
st.dataframe(
    [
        {
            "tenant": item.group,
            "requests": item.requests,
            "token hit rate": item.token_hit_rate,
            "eligible hit rate": eligible.get(item.group),
            "requests with any hit": item.request_hit_share,
            "tokens from cache": item.cached_tokens,
            "prompt tokens": item.prompt_tokens,
            "TTFT p50 hits (ms)": item.ttft_hit_p50_ms,
            "TTFT p50 misses (ms)": item.ttft_miss_p50_ms,
            "errors": item.error_requests,
        }
        for item in result.tenants
    ],
    hide_index=True,
    column_config={
        "requests": st.column_config.NumberColumn(format="localized"),
        "tokens from cache": st.column_config.NumberColumn(format="localized"),
        "prompt tokens": st.column_config.NumberColumn(format="localized"),
        "token hit rate": st.column_config.NumberColumn(format="percent"),
        "eligible hit rate": st.column_config.NumberColumn(
            format="percent", help="cached / (prompt - new tokens); empty where no request has a token ledger"
        ),
        "requests with any hit": st.column_config.NumberColumn(format="percent"),
        "TTFT p50 hits (ms)": st.column_config.NumberColumn(format="%.0f"),
        "TTFT p50 misses (ms)": st.column_config.NumberColumn(format="%.0f"),
    },
)
