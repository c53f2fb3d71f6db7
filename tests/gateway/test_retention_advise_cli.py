"""`prefixscope advise` shows retention advice per tenant and prefix (today's class, the best class, the saving per
day, writes never read again, the gap histogram, the toml lines), priced by the upstream kind named in the config."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from db.engine import create_sync_engine_for
from db.migrate import upgrade
from db.records import RequestRecord
from db.store import store_records
from db.timeutil import utc_now
from prefixscope.cli import main

CONFIG = """
[[upstreams]]
name = "claude"
url = "https://api.anthropic.com"
kind = "anthropic"

[advice.cache_prices.claude]
read = 0.1
"""


def _record(tenant: str, prefix: str, at_s: float, prompt: int, start) -> RequestRecord:  # type: ignore[no-untyped-def]
    return RequestRecord(
        request_id=f"{prefix}-{at_s}", created_at=start + timedelta(seconds=at_s), tenant=tenant, key_id=None,
        endpoint="messages", model="claude", upstream="claude", stream=False, status_code=200, error_type=None,
        prompt_tokens=prompt, cached_tokens=0, completion_tokens=1, ttft_ms=None, latency_ms=1.0,
        prefix_hash=prefix, retention_class="5m",
    )


@pytest.fixture
def setup(tmp_path: Path) -> tuple[str, Path]:
    url = f"sqlite:///{tmp_path}/retention.db"
    upgrade(url)
    start = utc_now() - timedelta(hours=3)
    records = [_record("bots", "a" * 16, i * 180.0, 3000, start) for i in range(50)]  # every 3 minutes
    records += [_record("bots", "b" * 16, i * 1200.0, 2000, start) for i in range(8)]  # every 20 minutes
    records += [_record("bots", "c" * 16, 60.0, 5000, start)]  # once
    engine = create_sync_engine_for(url)
    with engine.begin() as conn:
        store_records(conn, records)
    engine.dispose()
    config = tmp_path / "prefixscope.toml"
    config.write_text(CONFIG, encoding="utf-8")
    return url, config


def test_advise_prints_retention_per_prefix_with_the_toml_lines(
    setup: tuple[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    url, config = setup
    assert main(["advise", "--database-url", url, "--config", str(config), "--since", "1d"]) == 0
    out = capsys.readouterr().out
    # One class per tenant: 1h's gain on the 20-minute prefix outweighs its dearer single write of the 3-minute one.
    assert "retention for tenant bots (anthropic prices): advised class 1h" in out
    prefixes = out.split("retention for tenant bots")[1]
    assert "prefix aaaaaaaaaaaaaaaa (3000 tokens, 50 uses): today 5m, best 5m" in prefixes
    assert "prefix bbbbbbbbbbbbbbbb (2000 tokens, 8 uses): today 5m, best 1h" in prefixes
    assert "prefix cccccccccccccccc" not in prefixes  # used once: in the summary line
    assert "  1 prefix used once (5.0k tokens in all): none read again; not caching them saves" in prefixes
    assert "writes never read again today: 100%; gaps between uses: <=30m:7; median 20m" in prefixes
    assert '    [tenants.bots]\n    cache_retention = "1h"' in prefixes

    assert main(["advise", "--database-url", url, "--config", str(config), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    (tenant,) = document["retention"]
    best = {p["prefix_hash"][:1]: p["best"]["retention"] for p in tenant["prefixes"]}
    assert best == {"a": "5m", "b": "1h", "c": "none"}
    b = next(p for p in tenant["prefixes"] if p["prefix_hash"].startswith("b"))
    # 8 uses 20 minutes apart under 1h: one 2x write and seven 0.1x reads, against eight 1.25x writes today.
    assert b["saving_per_day"] == pytest.approx(2000 * (8 * 1.25) - 2000 * (2.0 + 7 * 0.1), rel=1e-3)  # the range is 1d
    assert document["patterns"] == []


def test_advise_refuses_bad_prices(setup: tuple[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    url, _ = setup
    bad = tmp_path / "bad.toml"
    bad.write_text(CONFIG.replace("read = 0.1", "read = -2"), encoding="utf-8")
    assert main(["advise", "--database-url", url, "--config", str(bad)]) == 2
    assert "cache price 'read' must be a non-negative number" in capsys.readouterr().err


def test_advise_prints_no_lines_that_contradict_the_advice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path}/retention.db"
    upgrade(url)
    start = utc_now() - timedelta(hours=1)
    records = [_record("oneoff", "d" * 16, 30.0, 4000, start)]  # used once: do not cache
    records += [_record("steady", "e" * 16, at, 256, start) for at in (60.0, 63.48193)]  # today's 5m is best
    engine = create_sync_engine_for(url)
    with engine.begin() as conn:
        store_records(conn, records)
    engine.dispose()
    config = tmp_path / "prefixscope.toml"
    config.write_text(CONFIG, encoding="utf-8")
    assert main(["advise", "--database-url", url, "--config", str(config), "--since", "1d"]) == 0
    out = capsys.readouterr().out
    oneoff = out.split("retention for tenant oneoff")[1].split("\n\n")[0]
    assert "advised class do not cache" in oneoff
    # No setting turns caching off: say so rather than print lines that keep caching.
    assert "max_cache_retention" not in oneoff and "[tenants.oneoff]" not in oneoff
    assert "no prefixscope.toml setting turns caching off for a tenant" in oneoff
    steady = out.split("retention for tenant steady")[1].split("\n\n")[0]
    assert steady.startswith(" (anthropic prices): keep today's class (5m): no other class saves more")
    assert "to apply it" not in steady and "[tenants.steady]" not in steady
    assert "gaps between uses: <=10s:1; median 3.5s, 90% within 3.5s" in steady
    assert "to do: keep today's class (5m): no class saves more" in steady
    assert "per day more than today's class" in steady  # the saving is against today's class, not against none


def test_prefixes_used_once_are_one_summary_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A small tenant's one-off prompts: one line saying how many and their tokens, not a block each; the prefix it
    reuses keeps its block. The count covers every prefix used once, also those beyond --top."""
    url = f"sqlite:///{tmp_path}/retention.db"
    upgrade(url)
    start = utc_now() - timedelta(hours=1)
    records = [_record("small", f"{i:016x}", 60.0 * i, 1000 + i, start) for i in range(1, 8)]  # 7 prefixes, once each
    records += [_record("small", "f" * 16, at, 3000, start) for at in (30.0, 90.0, 150.0)]
    engine = create_sync_engine_for(url)
    with engine.begin() as conn:
        store_records(conn, records)
    engine.dispose()
    config = tmp_path / "prefixscope.toml"
    config.write_text(CONFIG, encoding="utf-8")
    assert main(["advise", "--database-url", url, "--config", str(config), "--since", "1d", "--top", "3"]) == 0
    small = capsys.readouterr().out.split("retention for tenant small")[1].split("\n\n")[0]
    assert small.count("  prefix ") == 1 and "prefix ffffffffffffffff (3000 tokens, 3 uses)" in small
    (summary,) = [line for line in small.splitlines() if "used once" in line]
    assert summary.startswith("  7 prefixes used once (7.0k tokens in all): none read again; not caching them saves ")

    assert main(["advise", "--database-url", url, "--config", str(config), "--json", "--top", "3"]) == 0
    (tenant,) = json.loads(capsys.readouterr().out)["retention"]
    assert (tenant["used_once"]["prefixes"], tenant["used_once"]["tokens"]) == (7, sum(1000 + i for i in range(1, 8)))
