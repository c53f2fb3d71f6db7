"""The Conversations page, the Requests page's ledger and conversation link, and the eligible hit rate beside the
token hit rate, over a database of conversations (`tests/conversation_samples.py`)."""

from __future__ import annotations

import json
from dataclasses import fields
from datetime import timedelta

import pandas as pd
import pytest
from dashboard_testkit import create_database

from dashboard.charts_conversations import bar_labels, lost_by_cause_figure, marker_notes, parent_label
from db.ledger import TokenLedger
from db.queries.results_conversations import ConversationTurn, short_request_id
from db.timeutil import utc_now
from tests.conversation_samples import conversation_records, is_turn


@pytest.fixture(scope="module")
def sample():
    return conversation_records(utc_now() - timedelta(hours=2))


@pytest.fixture(scope="module")
def conversations_url(tmp_path_factory, sample):
    return create_database(tmp_path_factory.mktemp("conversations") / "prefixscope.db", sample)


def metrics(app) -> dict[str, str]:
    return {metric.label: metric.value for metric in app.metric}


def bars(app) -> dict[str, list]:
    """The waterfall's stacked bars: trace name -> tokens per turn."""
    specs = [json.loads(chart.proto.spec) for chart in app.get("plotly_chart")]
    waterfall = next(spec for spec in specs if "per turn" in json.dumps(spec["layout"]["title"]))
    return {trace["name"]: trace for trace in waterfall["data"]}


def expected_totals(records) -> dict[str, str]:
    """The page's first metrics, computed from the rows written (turns of a conversation only)."""
    turns = [r for r in records if is_turn(r)]
    ledgers = [TokenLedger.of(r) for r in turns]
    known = [r for r in turns if r.cached_tokens is not None]
    cached = sum(r.cached_tokens for r in known)
    eligible = sum(r.prompt_tokens - r.new_tokens for r in known)
    return {
        "Conversations": str(len({(r.tenant, r.conversation_id) for r in turns})),
        "Turns": str(len(turns)),
        "Token hit rate": f"{cached / sum(r.prompt_tokens for r in known):.1%}",
        "Eligible hit rate": f"{cached / eligible:.1%}",
        "Tokens lost": f"{sum(ledger.lost_tokens for ledger in ledgers if ledger.cached_tokens is not None):,}",
    }


def test_conversations_worst_first_and_the_worst_ones_waterfall(run_page, conversations_url, sample):
    app = run_page("conversations", conversations_url)
    shown = metrics(app)
    assert {label: shown[label] for label in expected_totals(sample)} == expected_totals(sample)
    table = app.dataframe[0].value
    assert list(table["conversation"]) == ["conv-a", "conv-b", "conv-c"]
    assert list(table["tokens lost"]) == ["912", "4", "-"]  # unknown is `-`, never 0
    assert list(table["eligible hit rate"]) == ["24.0%", "96.0%", "-"]
    # The worst conversation is shown: one bar per turn, the parts of each adding up to its prompt tokens.
    turns = [r for r in sample if r.conversation_id == "conv-a" and is_turn(r)]
    traces = bars(app)
    stacked = [name for name, trace in traces.items() if trace["type"] == "bar"]
    for position, record in enumerate(turns):
        assert sum(traces[name]["y"][position] for name in stacked) == record.prompt_tokens
    assert traces["cached (host)"]["y"] == [0, 0, 32, 0]
    assert traces["lost: answer_rewritten"]["y"] == [0, 0, 296, 0]
    assert traces["lost: evicted"]["y"] == [0, 0, 0, 584]
    # Page alignment also holds the last token the engine always computes: the legend says both.
    assert traces["lost: page alignment / last token"]["y"] == [0, 8, 8, 16]
    assert "lost: page_alignment" not in traces
    assert list(table["lost by cause"])[0] == "evicted 584, answer_rewritten 296, page alignment / last token 32"
    assert traces["answer rewritten"]["x"] == ["turn 3"]
    assert traces["replica changed"]["x"] == ["turn 3"]
    assert traces["idle past TTL"]["x"] == ["turn 3", "turn 4"]
    assert traces["divergence"]["x"] == ["turn 3", "turn 4"]
    assert metrics(app)["Conversation tokens lost"] == "912"


def test_a_linked_conversation_of_an_upstream_that_reports_nothing(run_page, conversations_url):
    app = run_page("conversations", conversations_url)
    app.query_params["conversation"] = "conv-c"
    app.query_params["tenant"] = "beta"
    app.run()
    assert not app.exception
    assert app.subheader[0].value == "Conversation conv-c"
    shown = metrics(app)
    assert shown["Conversation eligible hit rate"] == "-" and shown["Conversation tokens lost"] == "-"
    assert list(bars(app)) == ["unknown"]


def test_requests_detail_shows_the_ledger_and_links_its_conversation(run_page, conversations_url, sample):
    third = [r for r in sample if r.conversation_id == "conv-a"][2]
    app = run_page("requests", conversations_url)
    app.text_input(key="requests_detail_id").input(third.request_id).run()
    text = "\n".join(item.value for item in app.markdown)
    assert ("**Token ledger:** cached 96 (device 64 · host 32 · disk 0) + new 200 + lost 304 (answer_rewritten 296, "
            "page alignment / last token 8) + unknown 0 = 600 prompt tokens; eligible hit rate 24.0%") in text
    assert "[conv-a](conversations?conversation=conv-a&tenant=acme) · turn 3" in text
    assert "previous answer rewritten: whitespace at messages[2] +25" in text


def test_overview_and_tenants_show_the_eligible_hit_rate(run_page, conversations_url, seeded_url):
    shown = metrics(run_page("overview", conversations_url))
    # Over every request with a ledger: conv-a and conv-b (conv-c's upstream reports no cached tokens).
    assert shown["Eligible hit rate"] == f"{(288 + 96) / (1200 + 100):.1%}"
    assert metrics(run_page("overview", seeded_url))["Eligible hit rate"] == "-"  # rows without a ledger
    tenants = run_page("prefixes", conversations_url).dataframe[-1].value.set_index("tenant")
    assert tenants.loc["acme", "eligible hit rate"] == pytest.approx((288 + 96) / 1300)
    assert pd.isna(tenants.loc["beta", "eligible hit rate"])  # no request of beta has a ledger


def test_replicas_show_the_eligible_hit_rate(run_page, conversations_url):
    totals = run_page("replicas", conversations_url).dataframe[0].value.set_index("replica")
    # http://r1 served conv-a's turns 1 and 2, http://r2 turns 3 and 4: cached / (prompt - new) over each.
    assert totals.loc["http://r1", "eligible hit rate"] == pytest.approx(192 / 200)
    assert totals.loc["http://r2", "eligible hit rate"] == pytest.approx(96 / 1000)
    assert totals.loc["http://r1", "token hit rate"] == pytest.approx(192 / 600)


def test_the_lost_by_cause_chart_names_the_last_token_with_page_alignment():
    figure = lost_by_cause_figure({"page_alignment": 8, "evicted": 3})
    assert list(figure.data[0].y) == ["evicted", "page alignment / last token"]


def test_the_turn_table_names_each_parent_and_a_known_zero_loss(run_page, conversations_url, sample):
    app = run_page("conversations", conversations_url)
    turns = app.dataframe[1].value
    ids = [r.request_id for r in sample if r.conversation_id == "conv-a" and is_turn(r)]
    assert list(turns["parent"]) == ["-", *(f"turn {i} ({short_request_id(ids[i - 1])})" for i in (1, 2, 3))]
    assert list(turns["lost"])[:2] == ["0", "8"]  # turn 1's ledger lost nothing: 0, not unknown


def test_a_linked_conversation_of_another_tenant_is_not_found_for_that_tenant(run_page, conversations_url):
    app = run_page("conversations", conversations_url)
    app.query_params["conversation"] = "conv-a"
    app.query_params["tenant"] = "beta"
    app.run()
    assert not app.exception
    assert [item.value for item in app.warning] == ["No conversation with id 'conv-a' for tenant 'beta'."]


def _turn(**values) -> ConversationTurn:
    """A turn with every field unknown but `values`."""
    base = {item.name: None for item in fields(ConversationTurn)}
    base.update(request_id="req_1", created_at=utc_now(), has_ledger=False, replica_changed=False)
    base.update(values)
    return ConversationTurn(**base)


def test_only_a_turn_that_missed_carries_a_divergence_marker():
    hit = _turn(miss_reason="hit", divergence_segment="messages[1]", divergence_char_offset=26)
    missed = _turn(miss_reason="expired", divergence_segment="messages[1]", divergence_char_offset=26)
    assert "divergence" not in marker_notes(hit, None)
    assert marker_notes(missed, None)["divergence"] == "expired at messages[1] +26"


def test_two_turns_of_one_index_get_two_bars():
    """A retry or a fork: two `turn 2`, told apart by their short request ids (one bar each, not one merged bar)."""
    first = _turn(request_id="req_aaaaaaaa0001", turn_index=1, prompt_tokens=10, new_tokens=10)
    retry = [_turn(request_id=f"req_{letter * 8}0001", turn_index=2, prompt_tokens=20, new_tokens=20,
                   parent_request_id=first.request_id) for letter in "bc"]
    assert bar_labels([first, *retry]) == ["turn 1", "turn 2 (req_bbbbbbbb)", "turn 2 (req_cccccccc)"]
    assert parent_label(retry[1], [first, *retry]) == "turn 1 (req_aaaaaaaa)"
