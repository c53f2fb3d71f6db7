"""Conversations: per tenant, the conversations of a range worst first (most prompt tokens lost), and one
conversation's waterfall: each turn's prompt tokens as cached by tier, new and lost by cause.

The page reads `?conversation=ID` (and `&tenant=`) from its URL, which is how the Requests page links here.
"""

from __future__ import annotations

import streamlit as st

from dashboard import data, ui
from dashboard.charts_conversations import (
    lost_by_cause_figure,
    lost_by_cause_text,
    marker_notes,
    parent_label,
    turn_label,
    waterfall_figure,
)
from dashboard.data_conversations import CONVERSATIONS_LIMIT, conversation_turns, conversations_data

settings = ui.load_settings()
st.title("Conversations")

catalog = ui.read_database(data.catalog, settings.database_url)
filters = ui.sidebar_filters(catalog.tenants, [], with_model=False, first_seen=catalog.first_seen).refreshed()
linked_id = st.query_params.get("conversation")
linked_tenant = st.query_params.get("tenant")

ELIGIBLE_HELP = "cached / (prompt - new tokens): new turns are misses no cache could avoid"


def dash(value: int | None) -> str:
    """A token count, `-` when unknown."""
    return "-" if value is None else f"{value:,}"


def rate(value: float | None) -> str:
    """A share, `-` when unknown."""
    return "-" if value is None else ui.format_share(value)


result = ui.read_database(conversations_data, settings.database_url, filters.since, filters.until, filters.tenant)
totals = result.totals
if totals.conversations == 0 and not linked_id:
    ui.stop_with_info(
        f"No conversation in this range ({filters.label.lower()}). The gateway links a request to a conversation "
        "by its session id (the `x-prefixscope-session` header, `prompt_cache_key`, `metadata` or `user`) or by "
        "its content."
    )

columns = st.columns(5)
columns[0].metric("Conversations", f"{totals.conversations:,}")
columns[1].metric("Turns", f"{totals.turns:,}")
columns[2].metric("Token hit rate", rate(totals.token_hit_rate), help="cached / prompt tokens")
columns[3].metric("Eligible hit rate", rate(totals.eligible_hit_rate), help=ELIGIBLE_HELP)
columns[4].metric("Tokens lost", dash(totals.lost_tokens), help="prompt tokens computed before and computed again")

if result.conversations:
    if totals.lost_by_cause:
        st.plotly_chart(lost_by_cause_figure(totals.lost_by_cause), width="stretch")
    st.caption(
        f"The {ui.count_of(len(result.conversations), 'conversation')} with the most tokens lost "
        f"({filters.label}; at most {CONVERSATIONS_LIMIT}). Select one to see its turns; `-` is a count the "
        "upstream did not report."
    )
    table = st.dataframe(
        [
            {
                "conversation": row.conversation_id,
                "tenant": row.tenant,
                "turns": row.turns,
                "last turn (UTC)": row.last_at.replace(tzinfo=None),
                "prompt tokens": dash(row.prompt_tokens),
                "tokens lost": dash(row.lost_tokens),
                "token hit rate": rate(row.token_hit_rate),
                "eligible hit rate": rate(row.eligible_hit_rate),
                "lost by cause": lost_by_cause_text(row.lost_by_cause),
                "answer rewrites": row.answer_rewrites,
                "replicas": "-" if row.replicas is None else row.replicas,
            }
            for row in result.conversations
        ],
        hide_index=True,
        on_select="rerun",
        selection_mode="single-row",
        key="conversations_table",
        column_config={"last turn (UTC)": st.column_config.DatetimeColumn(format="YYYY-MM-DD HH:mm:ss")},
    )
    selected = table.selection.rows if table is not None and hasattr(table, "selection") else []
else:
    selected = []

if selected:
    chosen = result.conversations[selected[0]]
    conversation_id, tenant = chosen.conversation_id, chosen.tenant
elif linked_id:
    conversation_id, tenant = linked_id, linked_tenant
else:
    conversation_id, tenant = result.conversations[0].conversation_id, result.conversations[0].tenant

found = ui.read_database(conversation_turns, settings.database_url, conversation_id, tenant)
st.subheader(f"Conversation {conversation_id}")
if found is None:
    ui.stop_with_warning(
        f"No conversation with id {conversation_id!r}" + (f" for tenant {tenant!r}." if tenant else ".")
    )

summary = found.summary
st.caption(
    f"Tenant {summary.tenant} · {ui.count_of(summary.turns, 'turn')} from {summary.first_at:%Y-%m-%d %H:%M:%S} to "
    f"{summary.last_at:%Y-%m-%d %H:%M:%S} UTC · {ui.count_of(summary.replicas, 'replica') if summary.replicas else 'no replica set'} · "
    f"{ui.count_of(summary.answer_rewrites, 'answer rewrite')}"
)
columns = st.columns(4)
columns[0].metric("Turns in this conversation", f"{summary.turns:,}")
columns[1].metric("Conversation token hit rate", rate(summary.token_hit_rate), help="cached / prompt tokens")
columns[2].metric("Conversation eligible hit rate", rate(summary.eligible_hit_rate), help=ELIGIBLE_HELP)
columns[3].metric("Conversation tokens lost", dash(summary.lost_tokens))
st.plotly_chart(waterfall_figure(found.turns), width="stretch", key="conversation_waterfall")

rows = []
previous_replica: str | None = None
for position, turn in enumerate(found.turns):
    notes = marker_notes(turn, previous_replica)
    previous_replica = turn.replica or previous_replica
    rows.append(
        {
            "turn": turn_label(turn, position),
            "request": turn.request_id,
            "parent": parent_label(turn, found.turns),
            "time (UTC)": turn.created_at.replace(tzinfo=None),
            "prompt": dash(turn.prompt_tokens),
            "cached": dash(turn.cached_tokens),
            "new": dash(turn.new_tokens),
            "lost": dash(turn.lost_tokens),
            "unknown": dash(turn.unknown_tokens),
            "eligible hit rate": rate(turn.eligible_hit_rate),
            "idle (s)": "-" if turn.idle_s is None else f"{turn.idle_s:,.0f}",
            "retention TTL (s)": "-" if turn.ttl_s is None else f"{turn.ttl_s:,.0f}",
            "replica": turn.replica or "-",
            "why": turn.miss_reason or "-",
            "markers": "; ".join(f"{name}: {text}" for name, text in notes.items()) or "-",
        }
    )
st.dataframe(rows, hide_index=True, key="conversation_turns",
             column_config={"time (UTC)": st.column_config.DatetimeColumn(format="YYYY-MM-DD HH:mm:ss")})
