"""Requests: a filterable table of recent requests and the detail of one request (cached vs computed, why)."""

from __future__ import annotations

import streamlit as st

from dashboard import charts, data, ui
from dashboard.explain import (
    describe_divergence,
    describe_miss_kind,
    describe_provider_diagnosis,
    request_table_rows,
)
from dashboard.ledger_text import conversation_sentence, ledger_sentence
from db.records import MISS_KINDS, MISS_REASONS

settings = ui.load_settings()
st.title("Requests")

catalog = ui.read_database(data.catalog, settings.database_url)
if catalog.is_empty:
    ui.stop_with_info("No requests recorded yet. Send traffic through the gateway to see it here.")
filters = ui.sidebar_filters(catalog.tenants, catalog.models, first_seen=catalog.first_seen).refreshed()

outcome_choices = {"All": None, "Hits": True, "Misses": False}
left, middle, right = st.columns(3)
outcome = left.segmented_control(
    "Cache outcome",
    list(outcome_choices),
    default="All",
    key="requests_outcome",
    help="A hit reused more than the chat template's fixed opening (the leading tokens every prompt of its shape "
    "starts with); a request that matched only those is a miss.",
)
miss_kind = middle.selectbox("Miss kind", ["All", *MISS_KINDS], key="requests_miss_kind")
miss_reason = right.selectbox("Reason", ["All", *MISS_REASONS], key="requests_miss_reason")

rows = ui.read_database(
    data.recent_requests,
    settings.database_url,
    filters.since,
    filters.until,
    filters.tenant,
    filters.model,
    outcome_choices.get(outcome or "All"),
    None if miss_kind == "All" else miss_kind,
    None if miss_reason == "All" else miss_reason,
)
if not rows:
    ui.stop_with_info("No requests match these filters in this time range.")

st.caption(
    f"The {ui.count_of(len(rows), 'newest matching request')} ({filters.label}). Select a row to see its detail."
    if len(rows) > 1
    else f"The one matching request ({filters.label})."
)
table = st.dataframe(
    request_table_rows(rows),
    hide_index=True,
    on_select="rerun",
    selection_mode="single-row",
    key="requests_table",
    column_config={
        "time (UTC)": st.column_config.DatetimeColumn(format="YYYY-MM-DD HH:mm:ss"),
        "tenant": st.column_config.TextColumn(width="small"),
        "hit/miss": st.column_config.TextColumn(width="small"),
        "cached share": st.column_config.ProgressColumn(format="percent", min_value=0.0, max_value=1.0, width="small"),
        "prompt tokens": st.column_config.NumberColumn(format="localized", width="small"),
        "cached tokens": st.column_config.NumberColumn(format="localized", width="small"),
        "tokens lost": st.column_config.NumberColumn(
            format="localized", help="prompt tokens computed again", width="small"
        ),
        "offset": st.column_config.NumberColumn(help="character offset of the divergence inside the segment"),
    },
)
selected_rows = table.selection.rows if table is not None and hasattr(table, "selection") else []
typed_id = st.text_input("Request id", key="requests_detail_id", placeholder="or paste a request id").strip()
if typed_id:
    request_id = typed_id
elif selected_rows:
    request_id = rows[selected_rows[0]].request_id
else:
    request_id = rows[0].request_id

detail = ui.read_database(data.request_detail, settings.database_url, request_id)
st.subheader(f"Request {request_id}")
if detail is None:
    ui.stop_with_warning(f"No request with id {request_id!r}.")

columns = st.columns(5)
columns[0].metric("Prompt tokens", "unknown" if detail.prompt_tokens is None else f"{detail.prompt_tokens:,}")
columns[1].metric("Cached tokens", "unknown" if detail.cached_tokens is None else f"{detail.cached_tokens:,}")
computed = None
if detail.prompt_tokens is not None and detail.cached_tokens is not None:
    computed = max(detail.prompt_tokens - detail.cached_tokens, 0)
columns[2].metric("Computed tokens", "unknown" if computed is None else f"{computed:,}")
columns[3].metric(
    "TTFT",
    ui.format_ms(detail.ttft_ms),
    help={"engine": "the engine's own queue + prefill time (a non-streamed request)",
          "gateway": "measured by the gateway up to the first streamed content"}.get(detail.ttft_source or ""),
)
columns[4].metric("Latency", ui.format_ms(detail.latency_ms))

if computed is not None and detail.cached_tokens is not None:
    st.plotly_chart(charts.token_split_figure(detail.cached_tokens, computed), width="stretch")
else:
    st.info("The upstream did not report token counts for this request, so the cached/computed split is unknown.")

st.markdown(
    f"**Cache outcome:** "
    f"{describe_miss_kind(detail.miss_kind, None if detail.divergence_segment else detail.diverged_at_token)}"
)
tiers = (detail.cached_tokens_device, detail.cached_tokens_host, detail.cached_tokens_disk)
if all(tokens is not None for tokens in tiers):
    load_ms = detail.cache_load_ms
    load = "" if load_ms is None else f", loaded back to the device in {ui.format_ms(load_ms)}"
    served = " · ".join(f"{name} {tokens:,}" for name, tokens in zip(("device", "host", "disk"), tiers, strict=True))
    st.markdown(f"**Cached tokens by tier:** {served}{load}")
else:
    st.markdown("**Cached tokens by tier:** unknown (the upstream does not report tiers)")
st.markdown(f"**Token ledger:** {ledger_sentence(detail)}")
linked = conversation_sentence(detail)
if linked:
    st.markdown(f"**Conversation:** {linked}")
if detail.retention_class:
    st.markdown(f"**Retention class:** {detail.retention_class}")
why = describe_divergence(
    detail.miss_reason,
    detail.divergence_segment,
    detail.divergence_char_offset,
    detail.diverged_at_token,
    detail.recomputed_tokens,
    detail.divergence_source,
)
st.markdown(f"**Why:** {why}" if why else "**Why:** not explained (the upstream did not answer it)")
provider = describe_provider_diagnosis(detail.upstream, detail.provider_miss_reason, detail.provider_missed_tokens)
if provider:
    st.markdown(f"**Provider's reason:** {provider}")
rules = ", ".join(f"`{rule}`" for rule in detail.applied_rules) or "none (the request was already canonical)"
st.markdown(f"**Normalization rules applied:** {rules}")
st.markdown(
    f"**Tenant** {detail.tenant} · **model** {detail.model} · **upstream** {detail.upstream} · "
    f"**status** {detail.status_code}{f' ({detail.error_type})' if detail.error_type else ''} · "
    f"**at** {detail.created_at:%Y-%m-%d %H:%M:%S} UTC"
)
if detail.prefix_hash:
    st.markdown(f"**Prefix hash:** `{detail.prefix_hash}`")
if detail.prompt_text:
    with st.expander("Stored prompt text"):
        st.text(detail.prompt_text)
