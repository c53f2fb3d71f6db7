"""Replicas page and its queries: hit rate and load per replica over time, and router accuracy, from routed rows."""

from __future__ import annotations

from datetime import timedelta

import pytest
from dashboard_testkit import _record, create_database
from sqlalchemy import create_engine

from db.queries.replicas import replica_history, router_accuracy
from db.timeutil import utc_now

A, B = "http://127.0.0.1:8001", "http://127.0.0.1:8002"


def routed_records():
    moment = utc_now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=2) + timedelta(minutes=10)
    later = moment + timedelta(hours=1)

    def routed(index, at, replica, cached, predicted, source="precise", **fields):
        return _record(index, at, replica=replica, routing_policy="cache_aware", upstream="pool",
                       cached_tokens=cached, predicted_match_tokens=predicted, routing_index_source=source, **fields)

    return [
        routed(1, moment, A, 0, 0),
        routed(2, moment, A, 960, 960),
        routed(3, moment, B, 0, 0),
        routed(4, later, A, 976, 960),
        routed(5, later, B, 0, 320, "approximate"),
        routed(6, later, B, 960, 0, "approximate"),
        routed(7, later, B, None, 0, prompt_tokens=None),  # the upstream did not report tokens
        _record(8, later),  # not routed over a replica set
    ]


@pytest.fixture(scope="module")
def replicas_url(tmp_path_factory):
    return create_database(tmp_path_factory.mktemp("replicas") / "prefixscope.db", routed_records())


def test_replica_history_and_router_accuracy_queries(replicas_url):
    engine = create_engine(replicas_url)
    since = utc_now() - timedelta(days=1)
    with engine.connect() as conn:
        history = replica_history(conn, since)
        accuracy = router_accuracy(conn, since)
    engine.dispose()
    rows = [(row.replica, row.requests, row.prompt_tokens, row.cached_tokens, row.request_share) for row in history]
    assert rows == [
        (A, 2, 2000, 960, 2 / 3),
        (B, 1, 1000, 0, 1 / 3),
        (A, 1, 1000, 976, 1 / 4),
        (B, 3, 2000, 960, 3 / 4),
    ]
    assert history[0].bucket_start < history[2].bucket_start
    assert [(r.replica, r.index_source, r.requests, r.predicted_tokens, r.actual_cached_tokens) for r in accuracy] == [
        (A, "precise", 3, 1920, 1936),
        (B, "approximate", 2, 320, 960),
        (B, "precise", 1, 0, 0),
    ]
    assert [r.hit_miss_agreement for r in accuracy] == [1.0, 0.0, 1.0]
    assert [r.mean_abs_error_tokens for r in accuracy] == [16 / 3, (320 + 960) / 2, 0.0]


def test_replicas_page_shows_load_hit_rate_and_accuracy(run_page, replicas_url):
    app = run_page("replicas", replicas_url)
    totals = app.dataframe[0].value.set_index("replica")
    assert dict(totals["requests"]) == {A: 3, B: 4}
    assert totals.loc[A, "token hit rate"] == 1936 / 3000
    assert totals.loc[B, "share of requests"] == 4 / 7
    accuracy = app.dataframe[1].value
    assert list(accuracy["index"]) == ["precise", "approximate", "precise"]
    assert list(accuracy["predicted tokens"]) == [1920, 320, 0]
    specs = [chart.proto.spec for chart in app.get("plotly_chart")]
    assert len(specs) == 2
    assert "Token hit rate per replica" in specs[0] and "Load per replica" in specs[1]
    assert all(spec.count("127.0.0.1:8001") >= 1 and spec.count("127.0.0.1:8002") >= 1 for spec in specs)


def test_replicas_page_without_routed_requests(run_page, empty_url):
    app = run_page("replicas", empty_url)
    assert any("No request in this range was routed" in info.value for info in app.info)
