"""The database commands as a new user meets them: state in one per-user place, read commands that never create an
empty database, key commands on a fresh machine, and output that survives `| head`."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import pytest

from db import queries
from db.config import ENV_DATABASE_URL
from db.engine import create_sync_engine_for
from db.keys import key_id_of, load_active_keys, verify_key
from db.store import store_records
from prefixscope.cli import main
from prefixscope.invocation import typed_command
from prefixscope.paths import ENV_HOME


ROOT = Path(__file__).resolve().parents[2]


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh state directory, and no database URL in the environment: the defaults apply."""
    state = tmp_path / "state"
    monkeypatch.setenv(ENV_HOME, str(state))
    monkeypatch.delenv(ENV_DATABASE_URL, raising=False)
    monkeypatch.chdir(tmp_path)
    return state


@pytest.mark.parametrize(
    "argv",
    [
        ("stats",),
        ("stats", "--json"),
        ("keys", "list"),
        ("keys", "revoke", "0123456789ab"),
        ("db", "prune", "--older-than", "30d"),
        ("db", "rebuild-rollups"),
        ("simulate",),
        ("export-trace", "--out", "trace.jsonl"),
    ],
)
def test_read_commands_on_a_fresh_machine_say_what_to_run_and_create_nothing(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...]
) -> None:
    code, out, err = _run(capsys, *argv)
    database = home / "prefixscope.db"
    assert code == 2 and out == ""
    assert err.strip() == (
        f"prefixscope: error: no database at {database}: start the gateway (`{typed_command()} up` or "
        f"`{typed_command()} gateway`) or run `{typed_command()} db upgrade`, or point --database-url / "
        "$PREFIXSCOPE_DATABASE_URL at your database"
    )
    assert not database.exists() and not (tmp_path / "prefixscope.db").exists()


def test_db_current_on_a_missing_file_creates_nothing(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "db", "current")
    assert code == 0 and out.startswith("base (no database at ")
    assert not (home / "prefixscope.db").exists()


def test_a_database_without_tables_names_the_upgrade_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "blank.db"
    sqlite3.connect(path).close()
    url = f"sqlite:///{path}"
    code, _, err = _run(capsys, "keys", "list", "--database-url", url)
    assert code == 2
    assert err.strip() == (
        f"prefixscope: error: the database at {path} has no prefixscope tables: "
        f"run `{typed_command()} db upgrade --database-url {url}`"
    )
    code, _, err = _run(capsys, "stats", "--database-url", f"sqlite:///{tmp_path / 'missing.db'}")
    assert code == 2 and err.strip() == (
        f"prefixscope: error: no database at {tmp_path / 'missing.db'}: "
        f"run `{typed_command()} db upgrade --database-url sqlite:///{tmp_path / 'missing.db'}`"
    )
    assert not (tmp_path / "missing.db").exists()


def test_keys_create_before_the_gateway_ran_migrates_and_state_is_found_from_anywhere(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, _ = _run(capsys, "keys", "create", "--tenant", "acme")
    assert code == 0
    plaintext = out.strip().splitlines()[-1]
    assert (home / "prefixscope.db").exists() and not (tmp_path / "prefixscope.db").exists()

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, out, _ = _run(capsys, "keys", "list", "--json")
    listed = json.loads(out)
    assert code == 0 and [(item["key_id"], item["tenant"]) for item in listed] == [(key_id_of(plaintext), "acme")]
    assert listed[0]["created_at"].endswith("Z")

    # The whole key is accepted as well as its id.
    code, out, _ = _run(capsys, "keys", "revoke", plaintext)
    assert code == 0 and out.strip() == f"revoked {key_id_of(plaintext)}"
    engine = create_sync_engine_for(f"sqlite:///{home / 'prefixscope.db'}")
    try:
        assert verify_key(plaintext, load_active_keys(engine)) is None
    finally:
        engine.dispose()
    assert list(elsewhere.iterdir()) == []


def test_key_id_of_accepts_every_spelling() -> None:
    assert key_id_of("psk-0123456789ab-s3cr-et") == "0123456789ab"
    assert key_id_of(" psk-0123456789ab ") == "0123456789ab"
    assert key_id_of("0123456789ab") == "0123456789ab"


def test_stats_labels_rejected_requests_prints_unknown_cache_as_unknown_and_api_timestamps(
    db_url: str, capsys: pytest.CaptureFixture[str], make_record
) -> None:  # type: ignore[no-untyped-def]
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=2)
    engine = create_sync_engine_for(db_url)
    with engine.begin() as conn:
        store_records(
            conn,
            [
                make_record(created_at=hour, model="m1", upstream="local", prompt_tokens=100, cached_tokens=40),
                make_record(created_at=hour, model="m2", upstream="hosted", prompt_tokens=80, cached_tokens=None),
                # Rejected before routing: the gateway records no model and no upstream.
                make_record(
                    created_at=hour, model="", upstream="", status_code=400, error_type="invalid_request_error",
                    prompt_tokens=None, cached_tokens=None, completion_tokens=None, ttft_ms=None,
                ),
            ],
        )
    with engine.connect() as conn:
        expected = queries.stats(conn, hour - timedelta(hours=1), bucket="1d", group_by="upstream")
        per_model = queries.totals_by(conn, hour - timedelta(hours=1), group_by="model")  # the Cost page's query
    engine.dispose()
    assert [row.group for row in expected] == ["(rejected)", "hosted", "local"]
    assert [(row.group, row.requests) for row in per_model] == [("(rejected)", 1), ("m1", 1), ("m2", 1)]

    code, out, _ = _run(
        capsys, "stats", "--since", "1d", "--bucket", "1d", "--by", "upstream", "--json", "--database-url", db_url
    )
    rows = json.loads(out)
    assert code == 0 and [row["group"] for row in rows] == ["(rejected)", "hosted", "local"]
    # The same timestamp text as GET /api/stats, which msgspec encodes.
    api_form = json.loads(msgspec.json.encode(expected[0].bucket_start))
    assert rows[0]["bucket_start"] == api_form and api_form.endswith("T00:00:00Z")

    code, out, _ = _run(capsys, "stats", "--since", "1d", "--bucket", "1d", "--by", "model", "--database-url", db_url)
    # The figures table, up to the blank line before the cached-by-tier table.
    lines = {line.split()[2]: line.split() for line in out.split("\n\n")[0].splitlines()[1:]}
    assert code == 0 and set(lines) == {"(rejected)", "m1", "m2"}
    # columns: date time group requests prompt cached token-hit req-hit ttft-hit ttft-miss
    assert lines["m1"][5:7] == ["40", "40.0%"]
    assert lines["m2"][5:7] == ["-", "-"]  # unknown, the same in both columns
    assert lines["(rejected)"][5:7] == ["-", "-"]


def _demo(url: str) -> None:
    code = subprocess.run(
        [sys.executable, "-m", "prefixscope", "demo-data", "--rows", "1500", "--days", "2", "--chain-share", "1",
         "--database-url", url],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )
    assert code.returncode == 0


@pytest.mark.parametrize(
    "argv",
    [
        ("stats", "--since", "3d", "--by", "tenant", "--json"),
        ("export-trace", "--since", "3d", "--out", "-"),
    ],
)
def test_output_cut_short_by_the_reader_ends_quietly(tmp_path: Path, argv: tuple[str, ...]) -> None:
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    _demo(url)
    process = subprocess.Popen(
        [sys.executable, "-m", "prefixscope", *argv, "--database-url", url],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    first = process.stdout.readline()
    process.stdout.close()  # as `| head -1` does
    err = process.stderr.read().decode()
    assert process.wait(timeout=120) == 0
    assert first.strip() and err == ""


@pytest.mark.parametrize("argv", [("keys", "create", "--tenant", "acme"), ("db", "upgrade"), ("demo-data", "--rows", "1")])
def test_a_state_directory_that_cannot_be_made_is_one_line_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...]
) -> None:
    taken = tmp_path / "a-file"
    taken.write_text("not a directory\n")
    monkeypatch.setenv(ENV_HOME, str(taken))
    monkeypatch.delenv(ENV_DATABASE_URL, raising=False)
    code, out, err = _run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith(f"prefixscope: error: cannot create the directory {taken} for the database {taken}/")
