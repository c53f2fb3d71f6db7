"""The Conversations page's data: conversations worst first with their totals, one conversation's turns
(`db.queries.conversations`), and the eligible hit rate of a range from the rollups' ledger sums.

`load_*` are plain functions of a connection (timed by `prefixscope bench dashboard` like `dashboard.loaders`); the
wrappers below them cache them for the pages.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import streamlit as st
from sqlalchemy import Connection

from dashboard.data import CATALOG_TTL_S, LIVE_TTL_S, _read
from db.ledger import eligible_hit_rate
from db.queries.conversations import conversation, conversation_totals, conversations
from db.queries.results_conversations import Conversation, ConversationSummary, ConversationTotals
from db.queries.totals import ROLLUPS, rollup_filters, summed_rollups

CONVERSATIONS_LIMIT = 200


@dataclass(frozen=True)
class ConversationsData:
    """The `CONVERSATIONS_LIMIT` worst conversations of a range and the totals over all of them."""

    conversations: list[ConversationSummary]
    totals: ConversationTotals


def load_conversations(
    conn: Connection, since: datetime, until: datetime, tenant: str | None, limit: int = CONVERSATIONS_LIMIT
) -> ConversationsData:
    return ConversationsData(
        conversations(conn, since, until, tenant=tenant, limit=limit),
        conversation_totals(conn, since, until, tenant=tenant),
    )


def load_conversation(conn: Connection, conversation_id: str, tenant: str | None) -> Conversation | None:
    return conversation(conn, conversation_id, tenant=tenant)


def load_eligible_hit_rates(
    conn: Connection, since: datetime, until: datetime, tenant: str | None, model: str | None, group_by: str | None
) -> dict[str | None, float | None]:
    """cached / (prompt - new) over the requests with a ledger in the rollups of [since, until): per `group_by`
    value (`tenant`, `model`), or under the key None for the whole range. None where no request had a ledger."""
    groups = [ROLLUPS.c[group_by]] if group_by else []
    rows = summed_rollups(conn, rollup_filters(ROLLUPS, since, until, tenant=tenant, model=model), groups)
    return {
        (row[group_by] if group_by else None): eligible_hit_rate(
            int(row["ledger_cached_tokens"] or 0) if row["ledger_prompt_tokens"] else None,
            int(row["ledger_prompt_tokens"] or 0),
            int(row["new_tokens"] or 0),
        )
        for row in rows
    }


@st.cache_data(ttl=LIVE_TTL_S, show_spinner=False)
def conversations_data(url: str, since: datetime, until: datetime, tenant: str | None) -> ConversationsData:
    return _read(url, load_conversations, since, until, tenant)


@st.cache_data(ttl=CATALOG_TTL_S, show_spinner=False)
def conversation_turns(url: str, conversation_id: str, tenant: str | None) -> Conversation | None:
    return _read(url, load_conversation, conversation_id, tenant)


@st.cache_data(ttl=LIVE_TTL_S, show_spinner=False)
def eligible_hit_rates(
    url: str, since: datetime, until: datetime, tenant: str | None, model: str | None, group_by: str | None = None
) -> dict[str | None, float | None]:
    return _read(url, load_eligible_hit_rates, since, until, tenant, model, group_by)
