"""`conversations` and `conversation` on SQLite and PostgreSQL: sums per conversation, worst first, the turns with
their ledgers, and unknown counts read as None."""

from __future__ import annotations

from datetime import timedelta

import pytest

from db.engine import create_sync_engine_for
from db.queries.conversations import conversation, conversation_totals, conversations
from db.queries.replicas import replica_history
from db.queries.results_conversations import ConversationTotals
from db.store import store_records
from tests.conversation_samples import EXPECTED, comparable, conversation_records, figures

from .conftest import BASE_TIME


@pytest.fixture
def conn(db_url):
    engine = create_sync_engine_for(db_url)
    with engine.begin() as writing:
        store_records(writing, conversation_records(BASE_TIME))
    with engine.connect() as reading:
        yield reading
    engine.dispose()


def test_conversations_are_summed_worst_first(conn):
    listed = conversations(conn)
    assert [row.conversation_id for row in listed] == ["conv-a", "conv-b", "conv-c"]
    for row in listed:
        assert figures(row) == comparable(EXPECTED[row.conversation_id])
    first = listed[0]
    assert (first.first_at, first.last_at) == (BASE_TIME, BASE_TIME + timedelta(minutes=20))


def test_tenant_range_and_limit(conn):
    assert [row.conversation_id for row in conversations(conn, tenant="beta")] == ["conv-c"]
    assert [row.conversation_id for row in conversations(conn, tenant="acme", limit=1)] == ["conv-a"]
    assert conversations(conn, tenant="nobody") == []
    # Only the turns in the range count: conv-a's last turn (20 minutes in) falls outside.
    early = {row.conversation_id: row for row in conversations(conn, BASE_TIME, BASE_TIME + timedelta(minutes=10))}
    assert early["conv-a"].turns == 3 and early["conv-a"].lost_by_cause == {"answer_rewritten": 296,
                                                                           "page_alignment": 16}
    assert conversations(conn, limit=0) == []


def test_one_conversation_turn_by_turn(conn):
    found = conversation(conn, "conv-a", tenant="acme")
    assert found is not None
    assert figures(found.summary) == comparable(EXPECTED["conv-a"])
    turns = found.turns
    assert [turn.turn_index for turn in turns] == [1, 2, 3, 4]
    assert [turn.parent_request_id for turn in turns[1:]] == [turn.request_id for turn in turns[:-1]]
    for turn in turns:
        assert turn.has_ledger and turn.adds_up
        parts = turn.cached_tokens + turn.new_tokens + turn.lost_tokens + turn.unknown_tokens
        assert parts == turn.prompt_tokens
    third = turns[2]
    assert third.cached_by_tier == {"device": 64, "host": 32, "disk": 0}
    assert third.lost == {"answer_rewritten": 296, "page_alignment": 8}
    assert (third.answer_rewrite, third.answer_rewrite_segment, third.answer_rewrite_char_offset) == (
        "whitespace", "messages[2]", 25)
    assert (third.miss_reason, third.divergence_segment, third.divergence_char_offset) == (
        "answer_rewritten", "messages[2]", 25)
    assert [turn.replica_changed for turn in turns] == [False, False, True, False]
    assert [turn.ttl_s for turn in turns] == [300.0] * 4
    assert [turn.idle_beyond_ttl for turn in turns] == [None, False, True, True]
    assert turns[3].evicted_tier == "device" and turns[3].lost["evicted"] == 584
    assert third.eligible_hit_rate == pytest.approx(96 / 400)
    assert third.token_hit_rate == pytest.approx(96 / 600)


def test_unknown_stays_unknown(conn):
    found = conversation(conn, "conv-c")  # an admin: the tenant is the conversation's own
    assert found is not None and found.summary.tenant == "beta"
    for turn in found.turns:
        assert (turn.cached_tokens, turn.new_tokens, turn.lost_tokens, turn.token_hit_rate) == (None,) * 4
        assert (turn.eligible_hit_rate, turn.cached_by_tier, turn.has_ledger) == (None, None, False)
        assert turn.unknown_tokens == turn.prompt_tokens == 300 and turn.lost is None  # no ledger: not an empty one
        assert turn.ttl_s is None and turn.idle_beyond_ttl is None
    assert (found.summary.lost_tokens, found.summary.lost_by_cause) == (None, None)
    known = conversation(conn, "conv-b")
    assert known is not None and known.turns[0].lost == {} and known.turns[0].lost_tokens == 0  # known: none lost


def test_refused_and_unanswered_requests_are_no_turns(conn):
    """A row with a conversation id but a 4xx/5xx status (written before the gateway left the id out) is listed
    nowhere and counts in no conversation."""
    assert "conv-refused" not in [row.conversation_id for row in conversations(conn)]
    assert conversation(conn, "conv-refused") is None and conversation(conn, "conv-refused", tenant="acme") is None
    found = conversation(conn, "conv-a")
    assert found is not None and found.summary.turns == 4 and len(found.turns) == 4
    assert all(turn.prompt_tokens is not None for turn in found.turns)


def test_another_tenants_conversation_is_not_found(conn):
    assert conversation(conn, "conv-c", tenant="acme") is None
    assert conversation(conn, "conv-a", tenant="beta") is None
    assert conversation(conn, "no-such-id") is None


def test_totals_over_every_conversation(conn):
    totals = conversation_totals(conn)
    assert (totals.conversations, totals.turns, totals.prompt_tokens) == (3, 8, 2920)
    assert (totals.cached_tokens, totals.new_tokens, totals.lost_tokens, totals.unknown_tokens) == (384, 1020, 916, 600)
    assert totals.token_hit_rate == pytest.approx(384 / 2320)  # the turns that reported cached tokens
    assert totals.eligible_hit_rate == pytest.approx(384 / 1300)
    assert totals.lost_by_cause == {"answer_rewritten": 296, "evicted": 584, "page_alignment": 36}
    assert totals.answer_rewrites == 1
    beta = conversation_totals(conn, tenant="beta")
    assert (beta.lost_tokens, beta.lost_by_cause) == (None, None)
    assert conversation_totals(conn, tenant="nobody") == ConversationTotals()


def test_replica_history_carries_the_eligible_hit_rate(conn):
    rows = {row.replica: row for row in replica_history(conn, BASE_TIME, BASE_TIME + timedelta(hours=1), "1h")}
    # http://r1 served conv-a's turns 1 and 2, http://r2 turns 3 and 4; the other turns went to no replica set.
    assert (rows["http://r1"].eligible_tokens, rows["http://r1"].eligible_cached_tokens) == (200, 192)
    assert (rows["http://r2"].eligible_tokens, rows["http://r2"].eligible_cached_tokens) == (1000, 96)
    assert rows["http://r2"].eligible_hit_rate == pytest.approx(96 / 1000)
