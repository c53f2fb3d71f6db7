"""Rule advice page: per tenant, each candidate's sample size, estimate and the lines that enable it; reachable from
Why misses."""

from __future__ import annotations

from datetime import timedelta

import pytest
from dashboard_testkit import create_database

from dashboard.ui import RANGE_CHOICES
from db.advice import AdviceOutcome
from db.records import RequestRecord
from db.timeutil import utc_now

END = "hoist_volatile:end"
AFTER = "hoist_volatile:after_system"


def _records() -> list[RequestRecord]:
    moment = utc_now() - timedelta(minutes=30)
    base = dict(
        key_id=None,
        endpoint="chat.completions",
        model="m",
        upstream="engine",
        stream=False,
        status_code=200,
        error_type=None,
        completion_tokens=1,
        ttft_ms=200.0,
        latency_ms=210.0,
        miss_reason="volatile_value",
        divergence_segment="system",
        divergence_char_offset=12,
        recomputed_tokens=900,
    )
    agents = [
        RequestRecord(
            request_id=f"a{i}",
            created_at=moment + timedelta(seconds=i),
            tenant="agents",
            prompt_tokens=1000,
            cached_tokens=100,
            advice=(AdviceOutcome(END, 1010, 900, True), AdviceOutcome(AFTER, 1010, 700, True)),
            **base,
        )
        for i in range(12)
    ]
    steady = [
        RequestRecord(
            request_id=f"s{i}",
            created_at=moment + timedelta(seconds=i),
            tenant="steady",
            prompt_tokens=500,
            cached_tokens=400,
            advice=(AdviceOutcome(END, 500, 400, False),),
            **base,
        )
        for i in range(3)
    ]
    return agents + steady


@pytest.fixture(scope="module")
def advice_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return create_database(tmp_path_factory.mktemp("advice") / "prefixscope.db", _records())


def test_each_tenant_shows_its_candidates_with_sample_sizes(run_page, advice_url) -> None:
    app = run_page("advice", advice_url)
    assert [h.value for h in app.subheader] == ["Tenant agents", "Tenant steady"]
    agents = app.dataframe[0].value.set_index("candidate")
    end_title, after_title = "turn on hoist_volatile (placement end)", "turn on hoist_volatile (placement after_system)"
    assert list(agents.index) == [end_title, after_title]
    end = agents.loc[end_title]
    assert end["advice"] == "recommended" and end["sampled requests"] == 12
    assert end["hit rate now"] == pytest.approx(0.1)
    # The placements exclude each other: only the better one is recommended.
    assert agents.loc[after_title]["advice"] == f"gains less than: {end_title}"
    assert end["estimated hit rate"] == pytest.approx(10800 / 12120)
    assert bool(end["changes what the model reads"]) is True
    assert "end of the conversation" in end["what it changes"]
    steady = app.dataframe[1].value.iloc[0]
    assert steady["advice"] == "not enough samples" and steady["sampled requests"] == 3
    assert steady["estimated hit rate"] is None or steady["estimated hit rate"] != steady["estimated hit rate"]
    codes = [code.value for code in app.code]
    assert codes[0] == '[tenants.agents]\nrules = { hoist_volatile = true }\nhoist_placement = "end"'
    assert len(codes) == 1  # one placement is recommended for agents, nothing for steady
    assert any("merge into the tenant's table and rules if the file has them" in c.value for c in app.caption)
    assert any("changes what the model reads" in w.value for w in app.warning)
    # "Today" names the sidebar's range (the default one for this database: the last hour or 6 hours, by the clock).
    (chosen,) = [box.value for box in app.sidebar.selectbox if box.value in RANGE_CHOICES]
    assert chosen.startswith("Last ")
    today = [m.value for m in app.metric if m.label == f"Token hit rate, {chosen.lower()}"]
    assert today == ["10.0%", "80.0%"]
    best = [m.value for m in app.metric if m.label == "Best estimate with one more rule"]
    assert best == ["89.1%", "not enough samples"]
    # Three samples say nothing either way: the page must not claim that no rule would help.
    assert not any("Nothing to recommend" in info.value for info in app.info)
    assert any("Not enough sampled requests yet to advise: 3 of the 10" in info.value for info in app.info)
    assert any("so 7 more requests" in info.value for info in app.info)


def test_lower_minimum_shows_the_small_sample_and_recommends_nothing(run_page, advice_url) -> None:
    app = run_page("advice", advice_url)
    app.sidebar.number_input(key="advice_min_samples").set_value(3).run()
    steady = app.dataframe[1].value.iloc[0]
    assert steady["advice"] == "no gain"
    assert steady["estimated hit rate"] == pytest.approx(0.8)
    assert any("Nothing to recommend" in info.value for info in app.info)


def test_why_misses_links_to_rule_advice(run_page, advice_url) -> None:
    app = run_page("why_misses", advice_url)
    (link,) = app.get("page_link")
    assert "Rule advice" in link.proto.label
    assert link.proto.page.endswith("advice")
