"""The database's `prefixscope` commands, run in-process through `prefixscope.cli.main`."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from db import queries
from db.config import ENV_DATABASE_URL
from db.engine import create_sync_engine_for
from db.keys import load_active_keys, verify_key
from db.migrate import current_revision, head_revision
from db.store import store_records
from prefixscope.cli import main


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_db_upgrade_current_downgrade(empty_db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "db", "current", "--database-url", empty_db_url)
    assert code == 0 and out.startswith("base")
    code, out, _ = _run(capsys, "db", "upgrade", "--database-url", empty_db_url)
    assert code == 0 and head_revision() in out
    assert current_revision(empty_db_url) == head_revision()
    code, out, _ = _run(capsys, "db", "current", "--database-url", empty_db_url)
    assert "(head)" in out
    code, out, _ = _run(capsys, "db", "downgrade", "base", "--database-url", empty_db_url)
    assert code == 0 and current_revision(empty_db_url) is None


def test_keys_create_list_revoke(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(
        capsys, "keys", "create", "--tenant", "acme", "--admin", "--label", "ops", "--database-url", db_url
    )
    assert code == 0
    plaintext = out.strip().splitlines()[-1]
    engine = create_sync_engine_for(db_url)
    try:
        entry = verify_key(plaintext, load_active_keys(engine))
        assert entry is not None and entry.tenant == "acme" and entry.is_admin

        code, out, _ = _run(capsys, "keys", "list", "--database-url", db_url)
        assert code == 0 and entry.key_id in out and "acme" in out and "ops" in out
        assert plaintext not in out  # the key is shown once, at creation

        code, out, _ = _run(capsys, "keys", "create", "--tenant", "globex", "--json", "--database-url", db_url)
        created = json.loads(out)
        assert created["tenant"] == "globex" and created["plaintext_key"].startswith("psk-")

        code, out, _ = _run(capsys, "keys", "revoke", entry.key_id, "--database-url", db_url)
        assert code == 0
        assert verify_key(plaintext, load_active_keys(engine)) is None
        code, _, err = _run(capsys, "keys", "revoke", entry.key_id, "--database-url", db_url)
        assert code != 0 and "no active key" in err

        code, out, _ = _run(capsys, "keys", "list", "--active", "--json", "--database-url", db_url)
        assert [item["tenant"] for item in json.loads(out)] == ["globex"]
    finally:
        engine.dispose()


def test_stats_table_and_json(
    db_url: str, capsys: pytest.CaptureFixture[str], make_record, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    now = datetime.now(UTC)
    engine = create_sync_engine_for(db_url)
    with engine.begin() as conn:
        store_records(
            conn,
            [
                make_record(created_at=now - timedelta(hours=2), tenant="acme", prompt_tokens=100, cached_tokens=50),
                make_record(created_at=now - timedelta(hours=2), tenant="globex", prompt_tokens=100, cached_tokens=0),
                # A conversation's turn: 40 new tokens, 60 that could have been cached, 45 that were.
                make_record(created_at=now - timedelta(hours=2), tenant="initech", prompt_tokens=100, cached_tokens=45,
                            new_tokens=40, lost_evicted_tokens=15, unknown_tokens=0),
            ],
        )
    engine.dispose()
    monkeypatch.setenv(ENV_DATABASE_URL, db_url)  # no --database-url: taken from the environment

    code, out, _ = _run(capsys, "stats", "--since", "1d", "--bucket", "1d", "--by", "tenant", "--json")
    assert code == 0
    rows = {row["group"]: row for row in json.loads(out)}
    assert rows["acme"]["token_hit_rate"] == pytest.approx(0.5)
    assert rows["acme"]["eligible_hit_rate"] is None  # no ledger: unknown, not 0
    assert rows["initech"]["eligible_hit_rate"] == pytest.approx(0.75)
    assert rows["globex"]["request_hit_share"] == 0.0

    code, out, _ = _run(capsys, "stats", "--since", "1d", "--by", "tenant")
    assert code == 0 and "acme" in out and "50.0%" in out and "TOKEN HIT" in out
    assert "ELIGIBLE HIT" in out and "75.0%" in out
    code, out, _ = _run(capsys, "stats", "--since", "1d", "--tenant", "nobody")
    assert code == 0 and "no requests" in out


def test_bad_input_is_one_line_and_a_nonzero_status(capsys: pytest.CaptureFixture[str], db_url: str) -> None:
    code, _, err = _run(capsys, "stats", "--since", "last tuesday", "--database-url", db_url)
    assert code == 2 and "not a time" in err
    code, _, err = _run(capsys, "stats", "--bucket", "5m", "--database-url", db_url)
    assert code == 2 and "bucket" in err
    code, _, err = _run(capsys, "keys", "list", "--database-url", "mysql://x/y")
    assert code == 2 and "unsupported database URL" in err


def test_demo_data_command(empty_db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "demo-data", "--rows", "300", "--days", "2", "--database-url", empty_db_url)
    assert code == 0 and "300" in out
    code, out, _ = _run(capsys, "stats", "--since", "3d", "--bucket", "1w", "--json", "--database-url", empty_db_url)
    assert sum(row["requests"] for row in json.loads(out)) == 300


def test_prune_deletes_old_rows_and_keeps_history(db_url: str, capsys: pytest.CaptureFixture[str], make_record) -> None:  # type: ignore[no-untyped-def]
    now = datetime.now(UTC)
    old, recent = make_record(created_at=now - timedelta(days=40)), make_record(created_at=now - timedelta(hours=1))
    engine = create_sync_engine_for(db_url)
    try:
        with engine.begin() as conn:
            store_records(conn, [old, recent])
        code, out, _ = _run(capsys, "db", "prune", "--older-than", "30d", "--database-url", db_url)
        assert code == 0 and "deleted 1 " in out
        with engine.connect() as conn:
            assert [row.request_id for row in queries.recent_requests(conn, 10)] == [recent.request_id]
            assert queries.overview(conn, now - timedelta(days=60), now + timedelta(hours=1)).requests == 2
    finally:
        engine.dispose()


def test_stats_prints_cached_tokens_by_tier(
    db_url: str, capsys: pytest.CaptureFixture[str], make_record
) -> None:  # type: ignore[no-untyped-def]
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)
    engine = create_sync_engine_for(db_url)
    with engine.begin() as conn:
        store_records(conn, [
            make_record(created_at=hour, tenant="acme", cached_tokens=90, cached_tokens_device=50,
                        cached_tokens_host=30, cached_tokens_disk=10, cache_load_ms=4.0, retention_class="1h"),
            make_record(created_at=hour + timedelta(minutes=1), tenant="acme", cached_tokens=20),  # no tiers
            make_record(created_at=hour + timedelta(hours=1), tenant="beta", cached_tokens=7),  # no tiers
            make_record(created_at=hour + timedelta(hours=1), tenant="beta", cached_tokens=None),
        ])
    engine.dispose()
    code, out, _ = _run(capsys, "stats", "--since", "1d", "--by", "tenant", "--database-url", db_url)
    assert code == 0
    table = out.split("cached by tier")[1].splitlines()
    assert table[1].split() == ["BUCKET", "(UTC)", "TENANT", "DEVICE", "HOST", "DISK", "UNKNOWN", "LOAD", "ms", "avg"]
    assert table[2].split()[2:] == ["acme", "50", "30", "10", "20", "4.0"]
    assert table[3].split()[2:] == ["beta", "-", "-", "-", "7", "-"]  # no tier reported: unknown, not zero
    assert table[4].split() == ["TOTAL", "50", "30", "10", "27", "4.0"]
    assert "requests by retention class: 5m 0, 1h 1, persistent 0, none 3" in out

    code, out, _ = _run(capsys, "stats", "--since", "1d", "--by", "tenant", "--json", "--database-url", db_url)
    rows = {row["group"]: row for row in json.loads(out)}
    assert rows["acme"]["tiers"] == {"device": 50, "host": 30, "disk": 10, "unknown": 20}
    assert rows["acme"]["cache_load_ms_mean"] == 4.0 and rows["acme"]["requests_by_retention"] == {"1h": 1}
    assert rows["beta"]["tiers"] == {"device": 0, "host": 0, "disk": 0, "unknown": 7}
    assert rows["beta"]["requests_with_known_tiers"] == 0
