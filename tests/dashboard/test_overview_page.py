"""Overview page on a seeded database: the figures must equal the ones computed from the seeded rows."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

from dashboard_testkit import engine_stats_payload, expected_figures

from dashboard import ui
from dashboard.settings import DEFAULT_PREFILL_TOKENS_PER_S, ENV_PREFILL_TOKENS_PER_S


def metrics(app: object) -> dict[str, str]:
    return {metric.label: metric.value for metric in app.metric}  # type: ignore[attr-defined]


def captions(app: object) -> str:
    return "\n".join(caption.value for caption in app.caption)  # type: ignore[attr-defined]


def test_overview_shows_hit_rates_and_tokens_from_the_rows(run_page, seeded_url, records, engine) -> None:
    expected = expected_figures(records)
    app = run_page("overview", seeded_url, engine_url=engine[0])
    shown = metrics(app)
    assert shown["Requests"] == f"{expected.requests:,}"
    assert shown["Token hit rate"] == ui.format_share(expected.token_hit_rate) == "39.4%"
    assert shown["Requests with any hit"] == ui.format_share(expected.request_hit_share) == "66.7%"
    assert shown["Tokens served from cache"] == ui.format_tokens(expected.cached_tokens) == "3.15k"


def test_prefill_time_saved_uses_the_engines_measured_speed(run_page, seeded_url, records, engine) -> None:
    engine_url, state = engine
    state.stats = engine_stats_payload(prefill_tokens_per_s=500.0)
    app = run_page("overview", seeded_url, engine_url=engine_url)
    assert metrics(app)["Prefill time saved"] == ui.format_seconds(expected_figures(records).cached_tokens / 500.0)
    assert "the engine's measured prefill speed, 500 tokens/s" in captions(app)


def test_prefill_time_saved_falls_back_to_the_configured_default(run_page, seeded_url, records) -> None:
    app = run_page("overview", seeded_url, **{ENV_PREFILL_TOKENS_PER_S: "2000"})
    assert metrics(app)["Prefill time saved"] == ui.format_seconds(expected_figures(records).cached_tokens / 2000.0)
    assert "configured default of 2,000 tokens/s" in captions(app)
    assert "not reachable" in captions(app)


def test_prefill_default_is_used_while_the_engine_has_not_measured(run_page, seeded_url, engine) -> None:
    engine_url, state = engine
    state.stats = engine_stats_payload(prefill_tokens_per_s=None)
    app = run_page("overview", seeded_url, engine_url=engine_url)
    assert f"configured default of {DEFAULT_PREFILL_TOKENS_PER_S:,.0f} tokens/s" in captions(app)
    assert "has not measured" in captions(app)


def test_ttft_on_hits_and_misses(run_page, seeded_url) -> None:
    shown = metrics(run_page("overview", seeded_url))
    # Hits took 20-60 ms and misses 300-320 ms; the histogram estimates land within their bins.
    hit_p50 = float(shown["TTFT p50, hits"].removesuffix(" ms"))
    miss_p50 = float(shown["TTFT p50, misses"].removesuffix(" ms"))
    assert 15 <= hit_p50 <= 30
    assert 250 <= miss_p50 <= 400
    assert "p50 speed-up on hits" in shown


def test_tenant_filter_narrows_the_figures(run_page, seeded_url, records) -> None:
    app = run_page("overview", seeded_url)
    app.sidebar.selectbox[1].set_value("beta").run()
    assert not app.exception
    beta = [record for record in records if record.tenant == "beta"]
    shown = metrics(app)
    assert shown["Requests"] == str(len(beta))
    assert shown["Token hit rate"] == ui.format_share(expected_figures(beta).token_hit_rate) == "0.0%"


def test_time_range_without_requests_says_so(run_page, seeded_url) -> None:
    app = run_page("overview", seeded_url)
    app.sidebar.selectbox[0].set_value(ui.CUSTOM_RANGE).run()
    app.sidebar.date_input[0].set_value((date(2001, 1, 1), date(2001, 1, 7))).run()
    assert not app.exception
    assert any("No requests in this time range" in info.value for info in app.info)


def test_charts_are_drawn(run_page, seeded_url) -> None:
    app = run_page("overview", seeded_url)
    specs = [chart.proto.spec for chart in app.get("plotly_chart")]
    assert any("token hit rate" in spec for spec in specs)
    assert any("misses p50" in spec for spec in specs)


def test_empty_database_shows_a_message(run_page, empty_url) -> None:
    app = run_page("overview", empty_url)
    assert any("No requests recorded yet" in info.value for info in app.info)
    assert not app.metric


def test_database_without_schema_shows_a_warning(run_page, tmp_path: Path) -> None:
    bare = tmp_path / "bare.db"
    bare.write_bytes(b"")
    app = run_page("overview", f"sqlite:///{bare}")
    assert any("prefixscope db upgrade" in warning.value for warning in app.warning)


def test_missing_database_file_shows_a_warning_and_is_not_created(run_page, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.db"
    app = run_page("overview", f"sqlite:///{missing}")
    assert any("does not exist" in warning.value for warning in app.warning)
    assert not missing.exists()


def test_misconfigured_environment_shows_an_error(run_page, seeded_url) -> None:
    from dashboard.settings import ENV_REFRESH_S

    app = run_page("overview", seeded_url, **{ENV_REFRESH_S: "often"})
    assert any("misconfigured" in error.value and ENV_REFRESH_S in error.value for error in app.error)


def test_percentiles_stay_within_what_was_seen_and_the_caption_states_the_bound(run_page, seeded_url) -> None:
    app = run_page("overview", seeded_url)
    shown = metrics(app)
    # The slowest miss took 320 ms: interpolating to its bin's upper edge (about 422 ms) would overshoot it.
    assert float(shown["TTFT p95, misses"].removesuffix(" ms")) == 320
    assert "p95 misses 320.0-320.0 ms" in captions(app)
    assert "clamped to the values observed" in captions(app)


def test_the_help_text_says_exactly_what_counts_as_a_hit(run_page, seeded_url) -> None:
    app = run_page("overview", seeded_url)
    [hit_share] = [metric for metric in app.metric if metric.label == "Requests with any hit"]
    assert "reused more than the chat template's fixed opening" in hit_share.proto.help
    assert "matched only those counts as a miss" in hit_share.proto.help


def test_prefill_time_saved_uses_the_speed_recorded_with_the_database(run_page, records, engine, tmp_path) -> None:
    from datetime import UTC, datetime

    from dashboard_testkit import create_database

    from db.engine import create_sync_engine_for
    from db.engine_context import context_from_stats, record_engine_context

    url = create_database(tmp_path / "context.db", records)
    engine_db = create_sync_engine_for(url)
    with engine_db.begin() as conn:
        recorded_at = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
        record_engine_context(conn, context_from_stats("local", {"prefill_tokens_per_s": 250.0}, recorded_at))
    engine_db.dispose()
    engine_url, state = engine
    state.stats = engine_stats_payload(prefill_tokens_per_s=500.0)  # the live engine is another one: not borrowed
    app = run_page("overview", url, engine_url=engine_url)
    assert metrics(app)["Prefill time saved"] == ui.format_seconds(expected_figures(records).cached_tokens / 250.0)
    assert "the prefill speed recorded with this database, 250 tokens/s (engine `local`" in captions(app)


def test_a_fresh_install_opens_on_a_short_range_with_minute_points(run_page, tmp_path) -> None:
    from dataclasses import replace
    from datetime import UTC, datetime, timedelta

    from dashboard_testkit import create_database, seeded_records

    from dashboard.loaders import bucket_for_span

    now = datetime.now(UTC)
    # 6 minutes apart: distinct points on 1-minute buckets and on 5-minute ones, which the page takes when the oldest
    # row's hour began more than an hour ago (in the first minutes of an hour).
    fresh = [
        replace(record, created_at=now - timedelta(minutes=5 + 6 * index))
        for index, record in enumerate(seeded_records()[:4])
    ]
    app = run_page("overview", create_database(tmp_path / "fresh.db", fresh))
    assert app.sidebar.selectbox[0].value in ("Last hour", "Last 6 hours")  # the oldest row's hour is covered
    assert bucket_for_span(timedelta(hours=1)) == "1m"
    assert bucket_for_span(timedelta(hours=6)) == "5m"
    assert bucket_for_span(timedelta(days=7)) == "4h"
    hit_rate = json.loads(app.get("plotly_chart")[0].proto.spec)
    points = [x for trace in hit_rate["data"] for x in trace.get("x", [])]
    assert len(set(points)) >= 2  # minutes apart, not one dot at the edge of a week


def test_the_default_range_fits_the_data() -> None:
    from datetime import UTC, datetime, timedelta

    now = datetime(2026, 11, 30, 12, 30, tzinfo=UTC)
    assert ui.default_range(None, now) == "Last 7 days"
    assert ui.default_range(now - timedelta(minutes=40), now) == "Last hour"
    assert ui.default_range(now - timedelta(hours=3), now) == "Last 6 hours"
    assert ui.default_range(now - timedelta(days=3), now) == "Last 7 days"
    assert ui.default_range(now - timedelta(days=400), now) == "Last 30 days"


def test_the_fallback_caption_says_what_the_engine_answered(run_page, seeded_url) -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Refuses(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            self.send_error(401)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Refuses)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        app = run_page("overview", seeded_url, engine_url=f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()
    assert "the engine answered 401 to GET /v1/cache" in captions(app)


def _tiered_records() -> list:
    """The seeded requests, with tier splits, load times and retention classes on the four hits."""
    from dataclasses import replace

    from dashboard_testkit import seeded_records

    def split(device: int, host: int, disk: int) -> dict:
        return {"cached_tokens_device": device, "cached_tokens_host": host, "cached_tokens_disk": disk}

    changes = {
        "req-001": {**split(900, 0, 0), "retention_class": "5m"},
        "req-002": {**split(300, 600, 0), "cache_load_ms": 6.0, "retention_class": "1h"},
        # req-003 reports no tiers: its 900 cached tokens are of unknown tier.
        "req-004": {**split(0, 0, 448), "cache_load_ms": 14.0, "retention_class": "persistent"},
    }
    return [replace(record, **changes.get(record.request_id, {})) for record in seeded_records()]


def test_cached_tokens_by_tier_over_time_and_in_total(run_page, tmp_path) -> None:
    from dashboard_testkit import create_database

    app = run_page("overview", create_database(tmp_path / "tiers.db", _tiered_records()))
    shown = metrics(app)
    assert (shown["From device"], shown["From host"], shown["From disk"], shown["Tier unknown"]) == (
        "1.20k", "600", "448", "900")
    assert shown["Mean cache load"] == "10 ms"  # (6 + 14) / 2: per request that reported a load
    [figure] = [spec for spec in map(json.loads, (c.proto.spec for c in app.get("plotly_chart")))
                if spec["layout"]["title"]["text"] == "Cached tokens by tier"]
    stacked = {trace["name"]: sum(trace["y"]) for trace in figure["data"]}
    assert stacked == {"device": 1200, "host": 600, "disk": 448, "unknown": 900}
    assert sum(stacked.values()) == 3148  # every cached token, once
    assert figure["layout"]["barmode"] == "stack"
    assert "Requests by retention class: 5m 1, 1h 1, persistent 1, none 5" in captions(app)


def test_history_without_tiers_says_the_tier_is_unknown(run_page, seeded_url) -> None:
    app = run_page("overview", seeded_url)
    assert "all 3,148 cached tokens are of unknown tier" in captions(app)
    assert "From device" not in metrics(app)
    titles = [json.loads(chart.proto.spec)["layout"]["title"]["text"] for chart in app.get("plotly_chart")]
    assert "Cached tokens by tier" not in titles
