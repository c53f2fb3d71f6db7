"""Cost page: dollars saved under the default, a file-loaded and an edited price table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dashboard import ui
from dashboard.prices import DEFAULT_PRICE_TABLE, FALLBACK_MODEL
from dashboard.settings import ENV_PRICE_FILE


def metrics(app: object) -> dict[str, str]:
    return {metric.label: metric.value for metric in app.metric}  # type: ignore[attr-defined]


def usage(records, model: str) -> tuple[int, int]:
    chosen = [record for record in records if record.model == model]
    return sum(r.prompt_tokens or 0 for r in chosen), sum(r.cached_tokens or 0 for r in chosen)


def test_savings_under_the_default_table(run_page, seeded_url, records) -> None:
    app = run_page("cost", seeded_url)
    price = DEFAULT_PRICE_TABLE.prices[FALLBACK_MODEL]  # the seeded models are not listed by name
    saved = 0.0
    for model in ("m-small", "m-large"):
        prompt, cached = usage(records, model)
        without = prompt * price.input_per_mtok
        with_cache = cached * price.cached_input_per_mtok + (prompt - cached) * price.cache_write_per_mtok
        saved += (without - with_cache) / 1e6
    shown = metrics(app)
    assert shown["Saved by the cache"] == ui.format_usd(saved)
    frame = app.dataframe[-1].value.set_index("model")
    assert set(frame["priced as"]) == {FALLBACK_MODEL}
    assert frame.loc["m-small", "saved ($)"] == pytest.approx(3148 * (0.15 - 0.075) / 1e6)
    assert any(DEFAULT_PRICE_TABLE.as_of.isoformat() in caption.value for caption in app.caption)


def test_price_file_is_loaded(run_page, seeded_url, tmp_path: Path) -> None:
    prices = tmp_path / "prices.toml"
    prices.write_text(
        'as_of = 2026-01-15\nsource = "negotiated"\n'
        "[models.m-small]\ninput = 10.0\ncached_input = 1.0\n"
        "[models.m-large]\ninput = 4.0\ncached_input = 2.0\ncache_write = 5.0\n"
    )
    app = run_page("cost", seeded_url, **{ENV_PRICE_FILE: str(prices)})
    frame = app.dataframe[-1].value.set_index("model")
    assert frame.loc["m-small", "saved ($)"] == pytest.approx(3148 * 9.0 / 1e6)
    # m-large: nothing cached, and writing the cache costs more than plain input.
    assert frame.loc["m-large", "saved ($)"] == pytest.approx(-(4000 + 500) * 1.0 / 1e6)
    assert any("2026-01-15" in caption.value for caption in app.caption)


def test_unpriced_models_are_listed(run_page, seeded_url, tmp_path: Path) -> None:
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"as_of": "2026-01-15", "models": {"m-small": {"input": 1, "cached_input": 0.1}}}))
    app = run_page("cost", seeded_url, **{ENV_PRICE_FILE: str(prices)})
    assert any("No price for m-large" in warning.value for warning in app.warning)


def test_bad_price_file_falls_back_with_a_warning(run_page, seeded_url, tmp_path: Path) -> None:
    prices = tmp_path / "prices.json"
    prices.write_text("{not json")
    app = run_page("cost", seeded_url, **{ENV_PRICE_FILE: str(prices)})
    assert any("Using the built-in default prices" in warning.value for warning in app.warning)
    assert "Saved by the cache" in metrics(app)


def test_editing_the_as_of_date(run_page, seeded_url) -> None:
    app = run_page("cost", seeded_url)
    from datetime import date

    app.date_input[0].set_value(date(2026, 3, 1)).run()
    assert not app.exception
    assert any("prices as of 2026-03-01" in caption.value for caption in app.caption)


def test_empty_database_shows_a_message(run_page, empty_url) -> None:
    app = run_page("cost", empty_url)
    assert any("No requests recorded yet" in info.value for info in app.info)
