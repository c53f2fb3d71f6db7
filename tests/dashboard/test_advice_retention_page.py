"""Rule advice page, retention and fleet patterns: per tenant and prefix, today's class, the best class, the saving per
day and the toml lines (priced as the kind chosen on the page), the reuse by tier and class, and the patterns found
in stored signatures."""

from __future__ import annotations

from datetime import timedelta

import pytest
from dashboard_testkit import create_database

from db.signatures import PromptSignature
from db.records import RequestRecord
from db.timeutil import utc_now

BASE = dict(
    key_id=None, endpoint="chat.completions", model="m", upstream="claude", stream=False, status_code=200,
    error_type=None, completion_tokens=1, ttft_ms=None, latency_ms=1.0, cached_tokens=0,
)


def _signature(variant: int) -> PromptSignature:
    """Ten 64-character blocks: the first four and the last five the same for every variant, one block apart."""
    head = (1, 2, 3, 4, 100 + variant, 5, 6, 7, 8, 9)
    tail = (19, 18, 17, 16, 15, 200 + variant, 14, 13, 12, 11)
    return PromptSignature(64, 640, head, tail, (), 0, 2000, 500)


def _records() -> list[RequestRecord]:
    start = utc_now() - timedelta(hours=2)
    records = [
        RequestRecord(request_id=f"f{i}", created_at=start + timedelta(seconds=1200 * i), tenant="bots",
                      prompt_tokens=2000, prefix_hash="f" * 16, retention_class="5m", **BASE)
        for i in range(6)
    ]
    records += [
        RequestRecord(request_id=f"s{i}", created_at=start + timedelta(seconds=60 * i + 7), tenant=f"shop{i % 3}",
                      prompt_tokens=500, prefix_hash=f"{i % 3}" * 16, signature=_signature(i % 3), **BASE)
        for i in range(6)
    ]
    records += [_tiered(start, i) for i in range(6)]
    return records


def _tiered(start, i: int) -> RequestRecord:  # type: ignore[no-untyped-def]
    """A local prefix used every minute: odd uses read 192 tokens from the device and 64 from host memory, uses 2
    and 4 found it evicted from the device (the ledger says so)."""
    fields = {**BASE, "prompt_tokens": 400}
    if i % 2:
        fields |= {"cached_tokens": 256, "cached_tokens_device": 192, "cached_tokens_host": 64, "cached_tokens_disk": 0}
    elif i:
        fields |= {"miss_kind": "evicted", "lost_evicted_tokens": 256, "evicted_tier": "device", "new_tokens": 144,
                   "unknown_tokens": 0}
    return RequestRecord(request_id=f"e{i}", created_at=start + timedelta(seconds=60 * i + 3), tenant="gpu",
                         prefix_hash="e" * 16, **fields)


@pytest.fixture(scope="module")
def retention_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return create_database(tmp_path_factory.mktemp("retention") / "prefixscope.db", _records())


def test_retention_and_patterns_sections(run_page, retention_url) -> None:
    app = run_page("advice", retention_url)
    app.selectbox(key="retention_kind").set_value("anthropic").run()
    headers = [h.value for h in app.main.header]
    assert headers == ["Retention", "Fleet patterns"]
    assert "Retention for tenant bots" in [h.value for h in app.subheader]
    bots = next(t for t in app.dataframe if "best class" in t.value.columns and "f" * 16 in set(t.value["prefix"]))
    row = bots.value.set_index("prefix").loc["f" * 16]
    # Used every 20 minutes with 5-minute writes: every write expires unread; an hour's class pays.
    assert row["today"] == "5m" and row["best class"] == "1h"
    assert row["writes never read again"] == pytest.approx(1.0)
    assert row["saving per day (input-token equivalents)"] > 0
    assert any(code.value == '[tenants.bots]\ncache_retention = "1h"' for code in app.code)
    patterns = app.dataframe[-1].value
    (span,) = patterns.itertuples()
    assert span.pattern == "span" and span.requests == 6 and span.tenants == 3 and span.variants == 3
    assert "characters 256-320" in span.where
    # Per request, the 384 characters from the span's start on, at 500 tokens per 2000 characters.
    assert getattr(span, "_6") == 6 * 384 * 500 // 2000


def test_local_engine_prices_are_in_prefill_time(run_page, retention_url) -> None:
    app = run_page("advice", retention_url)
    assert app.selectbox(key="retention_kind").value == "local_engine"
    assert any("ms of prefill" in str(t.value.columns) for t in app.dataframe)


def test_reuse_by_tier_and_class(run_page, retention_url) -> None:
    app = run_page("advice", retention_url)
    table = next(t.value for t in app.dataframe if "evicted from device" in t.value.columns)
    row = table.set_index("prefix").loc["e" * 16]
    assert (row["read from device"], row["read from host"], row["evicted from device"]) == (3, 3, 2)
    assert row["reads per lost entry"] == 1.0
    advice = next(t.value for t in app.dataframe if "what to do" in t.value.columns and "e" * 16 in set(t.value["prefix"]))
    assert "evicted from device 2 times" in advice.set_index("prefix").loc["e" * 16, "what to do"]
