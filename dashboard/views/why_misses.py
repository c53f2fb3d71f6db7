"""Why misses: tokens lost per miss reason over time, where prompts diverged, example requests per reason, and what
normalization gained."""

from __future__ import annotations

import streamlit as st

from dashboard import charts_explain, data, data_explain, ui

# The Requests page's "Request id" box: filled in here to open an example there.
REQUESTS_DETAIL_KEY = "requests_detail_id"
REASON_MEANINGS = {
    "hit": "served from cache as far as it could be",
    "model_changed": "the model differs from the cached prompt's",
    "tools_changed": "the first difference lies in the tool definitions",
    "system_changed": "the first difference lies in the system prompt",
    "messages_changed": "the first difference lies in an earlier message",
    "volatile_value": "a value that changes on every call (a date, an id)",
    "reordered": "the same parts in another order",
    "new_prefix": "nothing like this prompt was cached",
    "evicted": "it was cached, then evicted for space",
    "expired": "it was cached, then dropped by its TTL",
    "below_page": "the prompt is shorter than one cache page",
}

settings = ui.load_settings()
st.title("Why misses")
st.page_link(
    "views/advice.py",
    label="Rule advice: what each rule this tenant has not enabled would gain",
    icon=":material/lightbulb:",
)

catalog = ui.read_database(data.catalog, settings.database_url)
if catalog.is_empty:
    ui.stop_with_info("No requests recorded yet. Send traffic through the gateway to see why requests miss the cache.")
filters = ui.sidebar_filters(catalog.tenants, catalog.models, with_model=False, first_seen=catalog.first_seen).refreshed()
result = ui.read_database(data_explain.why_misses, settings.database_url, filters.since, filters.until, filters.tenant)
st.caption(
    f"{filters.label}{' · ' + filters.tenant if filters.tenant else ''} · {filters.since:%Y-%m-%d %H:%M} to "
    f"{filters.until:%Y-%m-%d %H:%M} UTC · totals from the hourly rollups, the chart in "
    f"{ui.bucket_words(result.bucket)}"
)
if not result.totals:
    ui.stop_with_info(
        "No request in this time range has a recorded miss reason (the gateway explains requests whose upstream "
        "reports cached tokens). Pick a longer range or another tenant."
    )

misses = result.misses
missed_requests = sum(row.requests for row in misses)
columns = st.columns(4)
columns[0].metric("Requests explained", f"{result.explained_requests:,}")
columns[1].metric("Missed requests", f"{missed_requests:,}", help="any reason but hit")
columns[2].metric("Tokens lost", ui.format_tokens(result.tokens_lost), help="prompt tokens prefilled again")
worst = max(misses, key=lambda row: row.recomputed_tokens, default=None)
columns[3].metric("Costliest reason", worst.reason if worst and worst.recomputed_tokens else "none")

st.subheader("Tokens lost over time")
if not misses:
    st.info("Every explained request in this range was served from cache as far as it could be: nothing was lost.")
else:
    measure = st.segmented_control(
        "Measure", ["tokens lost", "requests"], default="tokens lost", key="why_misses_measure"
    )
    st.plotly_chart(
        charts_explain.miss_reasons_figure(
            result.series,
            [row.reason for row in sorted(misses, key=lambda row: -row.recomputed_tokens)],
            (result.first_bucket_start, filters.until),
            "requests" if measure == "requests" else "tokens",
        ),
        width="stretch",
    )
    st.dataframe(
        [
            {
                "reason": row.reason,
                "meaning": REASON_MEANINGS.get(row.reason, ""),
                "requests": row.requests,
                "share of misses": row.requests / missed_requests if missed_requests else None,
                "tokens lost": row.recomputed_tokens,
                "share of tokens lost": row.recomputed_tokens / result.tokens_lost if result.tokens_lost else None,
                "tokens lost per request": round(row.recomputed_tokens / row.requests) if row.requests else None,
            }
            for row in misses
        ],
        hide_index=True,
        key="why_misses_reasons",
        column_config={
            "meaning": st.column_config.TextColumn(width="large"),
            "requests": st.column_config.NumberColumn(format="localized"),
            "tokens lost": st.column_config.NumberColumn(format="localized"),
            "tokens lost per request": st.column_config.NumberColumn(format="localized"),
            "share of misses": st.column_config.ProgressColumn(format="percent", min_value=0.0, max_value=1.0),
            "share of tokens lost": st.column_config.ProgressColumn(format="percent", min_value=0.0, max_value=1.0),
        },
    )
    hits = next((row.requests for row in result.totals if row.reason == "hit"), 0)
    st.caption(
        f"Tokens lost are prompt tokens prefilled again because the prompt diverged from what had been cached. "
        f"{ui.count_of(hits, 'more request')} {'was' if hits == 1 else 'were'} served from cache as far as "
        f"{'it' if hits == 1 else 'they'} could be (reason `hit`)."
    )

st.subheader("Where prompts diverged")
if not result.locations:
    st.info(
        f"The {ui.count_of(missed_requests, 'missed request')} in this range recorded no place where "
        f"{'its prompt' if missed_requests == 1 else 'their prompts'} first differed from the cached one (the "
        "upstream reported none)."
        if missed_requests
        else "No request in this range missed the cache, so none has a place where its prompt first differed."
    )
else:
    left, right = st.columns([3, 2])
    left.plotly_chart(charts_explain.divergence_figure(result.locations), width="stretch")
    right.dataframe(
        [
            {
                "segment": location.segment,
                "characters": f"{location.char_offset_start:,}-{location.char_offset_end:,}",
                "requests": location.requests,
                "tokens lost": location.recomputed_tokens,
            }
            for location in result.locations
        ],
        hide_index=True,
        key="why_misses_locations",
        column_config={
            "requests": st.column_config.NumberColumn(format="localized"),
            "tokens lost": st.column_config.NumberColumn(format="localized"),
        },
    )
    st.caption(
        "The segment of the request (tools, system prompt, a message) and the character range inside it where the "
        "prompt first differed from the cached prefix, in 64-character steps, as the engine reported it: for a cold "
        "miss, the start of the request; for a hit, where its new turn begins (no tokens lost). A difference early "
        "in `tools` or `system` invalidates everything after it."
    )

st.subheader("Examples")
if misses:
    reason = st.selectbox("Reason", [row.reason for row in misses], key="why_misses_example_reason")
    examples = ui.read_database(
        data_explain.miss_examples, settings.database_url, reason, filters.since, filters.until, filters.tenant
    )
    if not examples:
        st.info(f"No stored request row with reason `{reason}` in this range (old rows may have been pruned).")
    else:
        picked = st.dataframe(
            [
                {
                    "time (UTC)": row.created_at.replace(tzinfo=None),
                    "tenant": row.tenant,
                    "model": row.model,
                    "prompt tokens": row.prompt_tokens,
                    "cached tokens": row.cached_tokens,
                    "tokens lost": row.recomputed_tokens,
                    "diverged at": ""
                    if row.divergence_segment is None
                    else f"{row.divergence_segment} @ char {row.divergence_char_offset or 0:,}",
                    "rules": ", ".join(row.applied_rules),
                    "request id": row.request_id,
                }
                for row in examples
            ],
            hide_index=True,
            on_select="rerun",
            selection_mode="single-row",
            key="why_misses_examples",
            column_config={
                "time (UTC)": st.column_config.DatetimeColumn(format="YYYY-MM-DD HH:mm:ss"),
                "prompt tokens": st.column_config.NumberColumn(format="localized"),
                "tokens lost": st.column_config.NumberColumn(format="localized"),
            },
        )
        rows = picked.selection.rows if picked is not None and hasattr(picked, "selection") else []
        chosen = examples[rows[0]] if rows else examples[0]
        st.caption(
            f"The {ui.count_of(len(examples), 'newest request')} with reason `{reason}`. Select one and open it with "
            "the button below."
        )
        if st.button(f"Open request {chosen.request_id} on the Requests page", key="why_misses_open"):
            st.session_state[REQUESTS_DETAIL_KEY] = chosen.request_id
            st.switch_page("views/requests.py")
else:
    st.info("No missed requests in this range.")

st.subheader("Normalization uplift")
gains = result.gains
if gains.sampled_requests == 0:
    st.info("No request in this range had its normalization gain measured.")
else:
    columns = st.columns(4)
    columns[0].metric("Tokens gained by normalization", ui.format_tokens(gains.gain_tokens))
    columns[1].metric("Sampled requests", f"{gains.sampled_requests:,}")
    columns[2].metric("Sampled requests that gained", f"{gains.requests_with_gain:,}")
    columns[3].metric("Share of sampled prompt tokens", ui.format_share(gains.gain_share))
    st.caption(
        "Measured on a sample: the gateway dry-runs the request as the client sent it and counts the prompt tokens "
        f"that hit only because normalization reordered or cleaned it ({gains.mean_gain_tokens or 0:,.0f} tokens per "
        "sampled request)."
    )
