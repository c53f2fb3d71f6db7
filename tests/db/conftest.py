"""Fixtures for the database tests: every test that takes `db_url` runs on SQLite and on PostgreSQL.

PostgreSQL tests get a database of their own, created from a migrated template in a database made for this test
session (`prefixscope_test_<random>`) and dropped afterwards, so runs never collide. Without a server they skip,
except with CI=true, where an unreachable server is a failure.
"""

from __future__ import annotations

import os
import secrets
import shutil
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import text

from db.engine import create_sync_engine_for
from db.migrate import upgrade
from db.records import RequestRecord
from db.store import rebuild_rollups

ADMIN_URL = os.environ.get("PREFIXSCOPE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


@dataclass(frozen=True)
class PostgresServer:
    """A reachable server and the names this session owns on it."""

    admin_conninfo: str
    base_url: str  # URL without the database name, e.g. postgresql://postgres@127.0.0.1:5432
    template: str  # a migrated database to copy for each test

    def url(self, database: str) -> str:
        return f"{self.base_url}/{database}"


def _admin(conninfo: str):  # type: ignore[no-untyped-def]
    import psycopg

    return psycopg.connect(conninfo, autocommit=True, connect_timeout=3)


def _drop(conninfo: str, database: str) -> None:
    with _admin(conninfo) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A session template database on the local PostgreSQL server, dropped at the end."""
    admin_conninfo = ADMIN_URL.replace("postgresql+psycopg://", "postgresql://")
    try:
        _admin(admin_conninfo).close()
    except Exception as exc:  # noqa: BLE001 - any failure to connect means "no server"
        message = f"PostgreSQL unreachable at {ADMIN_URL}: {exc}"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    base_url = admin_conninfo.rsplit("/", 1)[0]
    template = f"prefixscope_test_{secrets.token_hex(4)}"
    with _admin(admin_conninfo) as conn:
        conn.execute(f'CREATE DATABASE "{template}"')
    server = PostgresServer(admin_conninfo, base_url, template)
    try:
        upgrade(server.url(template))
        yield server
    finally:
        _drop(admin_conninfo, template)


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated SQLite file, copied for each test (faster than migrating every time)."""
    path = tmp_path_factory.mktemp("sqlite-template") / "template.db"
    upgrade(f"sqlite:///{path}")
    return path


def _fresh_postgres(server: PostgresServer, migrated: bool) -> Iterator[str]:
    database = f"{server.template}_{secrets.token_hex(3)}"
    source = server.template if migrated else "template0"
    with _admin(server.admin_conninfo) as conn:
        conn.execute(f'CREATE DATABASE "{database}" TEMPLATE "{source}"')
    try:
        yield server.url(database)
    finally:
        _drop(server.admin_conninfo, database)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest) -> str:
    """Which database the test runs on."""
    return str(request.param)


@pytest.fixture
def db_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of a fresh database migrated to head."""
    if backend == "sqlite":
        path = tmp_path / "prefixscope.db"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        yield f"sqlite:///{path}"
    else:
        yield from _fresh_postgres(request.getfixturevalue("postgres_server"), migrated=True)


@pytest.fixture
def empty_db_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of a fresh database without any tables."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}"
    else:
        yield from _fresh_postgres(request.getfixturevalue("postgres_server"), migrated=False)


BASE_TIME = datetime(2025, 3, 10, 12, 0, tzinfo=UTC)  # a Monday


def record(**overrides: Any) -> RequestRecord:
    """A successful, fully reported chat request; override any field."""
    values: dict[str, Any] = {
        "request_id": str(uuid.uuid4()),
        "created_at": BASE_TIME,
        "tenant": "acme",
        "key_id": "k1",
        "endpoint": "chat.completions",
        "model": "m1",
        "upstream": "local",
        "stream": False,
        "status_code": 200,
        "error_type": None,
        "prompt_tokens": 100,
        "cached_tokens": 0,
        "completion_tokens": 10,
        "ttft_ms": 50.0,
        "latency_ms": 120.0,
    }
    values.update(overrides)
    return RequestRecord(**values)


@pytest.fixture
def make_record() -> Callable[..., RequestRecord]:
    """`make_record(**overrides)`: a valid record with a fresh id (see `record`)."""
    return record


def stored_ids(url: str) -> list[str]:
    """Every request id in the database (with repeats, should there be any)."""
    engine = create_sync_engine_for(url)
    try:
        with engine.connect() as conn:
            return list(conn.scalars(text("SELECT id FROM requests")))
    finally:
        engine.dispose()


def _comparable(value: Any) -> str:
    # Float sums depend on the order of addition: compare them to a precision far finer than any figure shown.
    return f"{value:.9g}" if isinstance(value, float) else str(value)


ROLLUP_TABLES = (
    "hourly_rollups",
    "hourly_ttft_bins",
    "hourly_label_counts",
    "hourly_prefix_rollups",
    "hourly_miss_reasons",
    "hourly_divergences",
)


def rollup_snapshot(url: str) -> list[tuple[Any, ...]]:
    """All rows of every rollup table, sorted, for comparisons."""
    engine = create_sync_engine_for(url)
    try:
        with engine.connect() as conn:
            rows: list[tuple[Any, ...]] = []
            for table in ROLLUP_TABLES:
                rows += sorted((table, *map(_comparable, row)) for row in conn.execute(text(f"SELECT * FROM {table}")))
            return rows
    finally:
        engine.dispose()


def assert_rollups_match_requests(url: str) -> None:
    """The incrementally maintained rollups equal a rebuild from the request rows."""
    before = rollup_snapshot(url)
    engine = create_sync_engine_for(url)
    try:
        with engine.begin() as conn:
            rebuild_rollups(conn)
    finally:
        engine.dispose()
    assert rollup_snapshot(url) == before


@pytest.fixture
def db_helpers() -> SimpleNamespace:
    """Helpers that read a database by URL: `stored_ids`, `rollup_snapshot`, `assert_rollups_match_requests`."""
    return SimpleNamespace(
        stored_ids=stored_ids,
        rollup_snapshot=rollup_snapshot,
        assert_rollups_match_requests=assert_rollups_match_requests,
    )
