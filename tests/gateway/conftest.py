"""Fixtures for the gateway tests: a stub upstream and gateways running in background threads."""

from __future__ import annotations

import os
import socket
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

sys.path.insert(0, str(Path(__file__).parent))

from gateway_testkit import (  # noqa: E402
    RunningGateway,
    StubState,
    StubUpstream,
    gateway_config,
    running_gateway,
    serve_in_thread,
)


@pytest.fixture(scope="session")
def engine_url() -> Iterator[str]:
    """The real engine with its default cache (page size 1, no TTL), shared by the real-model tests."""
    from real_engine_kit import running_engine

    with running_engine("--kv-cache-tokens", "16384") as url:
        yield url


@pytest.fixture(scope="session")
def stub_server() -> Iterator[tuple[StubUpstream, str]]:
    stub = StubUpstream()
    with serve_in_thread(stub) as url:
        yield stub, url


@pytest.fixture
def stub(stub_server: tuple[StubUpstream, str]) -> StubUpstream:
    """The stub upstream with fresh state for this test."""
    stub_server[0].state = StubState()
    return stub_server[0]


@pytest.fixture
def stub_url(stub_server: tuple[StubUpstream, str]) -> str:
    return stub_server[1]


@pytest.fixture
def gateway(stub: StubUpstream, stub_url: str) -> Iterator[RunningGateway]:
    """An open-mode gateway (no keys) in front of the stub, with a fake storage."""
    with running_gateway(gateway_config(stub_url)) as running:
        yield running


def _postgres_admin_url() -> str:
    return os.environ.get("PREFIXSCOPE_TEST_POSTGRES_URL", "postgresql+psycopg://root@127.0.0.1:5432/postgres")


def _postgres_reachable() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 5432), timeout=2):
            return True
    except OSError:
        return False


@pytest.fixture
def postgres_database():
    """A fresh database on the local PostgreSQL server, dropped afterwards."""
    if not _postgres_reachable():
        message = "PostgreSQL is not reachable on 127.0.0.1:5432"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    name = f"gateway_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(_postgres_admin_url(), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield name
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
