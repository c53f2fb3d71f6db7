"""Prefixes and rules page: reuse per prefix, rule counts and the tenants table, checked against the seeded rows."""

from __future__ import annotations

from collections import Counter

from dashboard_testkit import ALPHA_PROMPT_TEXT, PREFIX_ALPHA, PREFIX_BETA


def frames(app: object) -> list:
    return [item.value for item in app.dataframe]  # type: ignore[attr-defined]


def test_top_prefixes_with_tokens_saved_and_label(run_page, seeded_url, records) -> None:
    app = run_page("prefixes", seeded_url)
    prefixes = frames(app)[0].set_index("prefix hash")
    alpha = [record for record in records if record.prefix_hash == PREFIX_ALPHA]
    assert list(prefixes.index) == [PREFIX_ALPHA, PREFIX_BETA]  # ranked by tokens saved
    assert prefixes.loc[PREFIX_ALPHA, "requests"] == len(alpha)
    assert prefixes.loc[PREFIX_ALPHA, "tokens saved"] == sum(record.cached_tokens or 0 for record in alpha)
    assert prefixes.loc[PREFIX_BETA, "tokens saved"] == 0
    assert prefixes.loc[PREFIX_ALPHA, "requests with hit"] == 1.0
    assert prefixes.loc[PREFIX_BETA, "label"] == ""
    # The newest alpha request did not store its prompt; the label comes from an older one that did.
    assert prefixes.loc[PREFIX_ALPHA, "label"] == ALPHA_PROMPT_TEXT


def test_rule_counts_match_the_rows(run_page, seeded_url, records) -> None:
    app = run_page("prefixes", seeded_url)
    rules = frames(app)[1].set_index("rule")
    expected = Counter(rule for record in records for rule in record.applied_rules)
    assert dict(rules["requests changed"]) == dict(expected)
    assert rules.loc["canonical_json_keys", "share of requests"] == expected["canonical_json_keys"] / len(records)


def test_tenants_table(run_page, seeded_url, records) -> None:
    app = run_page("prefixes", seeded_url)
    tenants = frames(app)[2].set_index("tenant")
    assert set(tenants.index) == {"alpha", "beta"}
    assert tenants.loc["alpha", "requests"] == sum(1 for record in records if record.tenant == "alpha")
    assert tenants.loc["alpha", "token hit rate"] == (3 * 900 + 448) / 4000
    assert tenants.loc["beta", "errors"] == 1


def test_tenant_filter(run_page, seeded_url) -> None:
    app = run_page("prefixes", seeded_url)
    app.sidebar.selectbox[1].set_value("beta").run()
    assert not app.exception
    assert list(frames(app)[0]["prefix hash"]) == [PREFIX_BETA]
    assert list(frames(app)[-1]["tenant"]) == ["beta"]


def test_empty_database_shows_a_message(run_page, empty_url) -> None:
    app = run_page("prefixes", empty_url)
    assert any("No requests recorded yet" in info.value for info in app.info)


def test_long_ranges_cover_every_prefix_request(run_page, seeded_url, records) -> None:
    app = run_page("prefixes", seeded_url)
    app.sidebar.selectbox[0].set_value("Last 90 days").run()
    assert not app.exception
    # Prefix reuse comes from the hourly prefix rollup, so no range is capped or needs saying so.
    assert not any("covers the last" in caption.value for caption in app.caption)
    assert frames(app)[0]["requests"].sum() == sum(1 for record in records if record.prefix_hash)
